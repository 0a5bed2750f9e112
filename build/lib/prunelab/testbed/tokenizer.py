"""Byte-level BPE tokenizer for the testbed language, trained locally on generated text.

Why a small vocabulary: on CPU the output layer (hidden x vocab) dominates training cost of tiny
models, and the testbed language has only a few hundred word types, so 2048 tokens cover every
word as one token while still being a real byte-level BPE (any string round-trips).

The result is saved in standard Hugging Face form (``tokenizer.json`` + ``tokenizer_config.json``
with ``PreTrainedTokenizerFast``), so ``transformers.AutoTokenizer.from_pretrained(dir)`` loads
it. Regenerate with ``python -m prunelab.testbed.tokenizer`` (writes ``TOKENIZER_DIR``).
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from prunelab.testbed import corpus

logger = logging.getLogger(__name__)

END_OF_TEXT = "<|endoftext|>"
VOCAB_SIZE = 2048
TRAINING_DOCUMENTS = 20_000
TOKENIZER_DIR = Path(__file__).resolve().parent / "checkpoints" / "tokenizer"


def train_tokenizer(vocab_size: int = VOCAB_SIZE,
                    num_documents: int = TRAINING_DOCUMENTS) -> Tokenizer:
    """Train a byte-level BPE on the first ``num_documents`` train documents (deterministic)."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[END_OF_TEXT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    texts = corpus.documents("train", num_documents)
    logger.info("training BPE (vocab %d) on %d documents", vocab_size, len(texts))
    tokenizer.train_from_iterator(texts, trainer=trainer, length=len(texts))
    return tokenizer


def save_tokenizer(tokenizer: Tokenizer, directory: str | Path) -> Path:
    """Save as a ``PreTrainedTokenizerFast`` directory loadable by ``AutoTokenizer``."""
    from transformers import PreTrainedTokenizerFast

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=END_OF_TEXT,
        eos_token=END_OF_TEXT,
        unk_token=END_OF_TEXT,
        pad_token=END_OF_TEXT,
        model_max_length=2048,
        clean_up_tokenization_spaces=False,
    )
    wrapped.save_pretrained(directory)
    _force_tokenizer_class(directory)
    return directory


def _force_tokenizer_class(directory: Path) -> None:
    import json

    config_path = directory / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config_path.write_text(json.dumps(config, indent=2) + "\n")


def load_tokenizer(directory: str | Path = TOKENIZER_DIR):
    """The shipped tokenizer as a ``transformers`` fast tokenizer."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(directory))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(TOKENIZER_DIR))
    parser.add_argument("--vocab-size", type=int, default=VOCAB_SIZE)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    directory = save_tokenizer(train_tokenizer(args.vocab_size), args.out)
    logger.info("saved tokenizer to %s", directory)


if __name__ == "__main__":
    main()
