"""Train a testbed model on CPU from a recipe and ship it in standard Hugging Face format.

Usage::

    python -m prunelab.testbed.train recipe=testbed_llama [train.minutes=50 output_dir=/tmp/x ...]

The recipe (``recipes/<name>.yaml``, OmegaConf) fixes architecture, optimiser, budget (steps,
or wall-clock minutes) and seed; ``key=value`` arguments override it. Data is the deterministic
``corpus`` train stream, joined with blank lines, cut into ``seq_len`` windows and shuffled in
blocks with a seeded RNG, so the data order is reproducible (with a wall-clock budget, only the
number of steps taken depends on the machine). Models are built with transformers' own classes
(``LlamaForCausalLM``, ``GPTNeoXForCausalLM``), saved float32 with ``save_pretrained`` plus the
tokenizer files, and described by a ``README.md`` model card whose numbers come from
``quality.evaluate``. With ``checkpoint_fractions`` set, a Pythia-style series of
``step<N>/`` directories is written instead of a single directory.

Regenerate everything shipped::

    python -m prunelab.testbed.tokenizer
    python -m prunelab.testbed.train recipe=testbed_llama
    python -m prunelab.testbed.train recipe=testbed_pythia
"""

from __future__ import annotations

import json
import logging
import math
import random
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from prunelab.testbed import CHECKPOINT_DIR, corpus, quality
from prunelab.testbed import tokenizer as testbed_tokenizer

logger = logging.getLogger(__name__)

PACKAGE_DIR = Path(__file__).resolve().parent
RECIPE_DIR = PACKAGE_DIR / "recipes"
DOCUMENTS_PER_BLOCK = 2048


def load_recipe(name: str, overrides: list[str] = ()) -> DictConfig:
    """Recipe ``name`` (a file in ``recipes/`` or a path) with dotlist ``overrides`` applied."""
    path = Path(name) if name.endswith(".yaml") else RECIPE_DIR / f"{name}.yaml"
    recipe = OmegaConf.load(path)
    recipe = OmegaConf.merge(recipe, OmegaConf.from_dotlist(list(overrides)))
    if recipe.get("output_dir") in (None, ""):
        recipe.output_dir = str(CHECKPOINT_DIR / recipe.name)
    return recipe


def padded_vocab_size(tokenizer, multiple: int = 64) -> int:
    return math.ceil(len(tokenizer) / multiple) * multiple


def build_model(recipe: DictConfig, tokenizer) -> torch.nn.Module:
    """A freshly initialised transformers model for ``recipe.arch`` ("llama" or "gpt_neox")."""
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(recipe.seed)
    options = OmegaConf.to_container(recipe.model, resolve=True)
    common = dict(
        vocab_size=padded_vocab_size(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        max_position_embeddings=recipe.train.seq_len,  # the context it is trained on: longer windows are out of distribution
    )
    if recipe.arch == "llama":
        config = LlamaConfig(**common, **options)
        model = LlamaForCausalLM(config)
    elif recipe.arch == "gpt_neox":
        config = GPTNeoXConfig(**common, **options)
        model = GPTNeoXForCausalLM(config)
    else:
        raise ValueError(f"unknown arch {recipe.arch!r}")
    return model.float()


def training_batches(tokenizer, seq_len: int, batch_size: int, seed: int) -> Iterator[torch.Tensor]:
    """Endless deterministic batches [batch_size, seq_len] from the corpus train stream."""
    rng = random.Random(seed)
    separator = tokenizer("\n\n", add_special_tokens=False)["input_ids"]
    documents = corpus.iter_documents("train")
    stream: list[int] = []
    pending: list[list[int]] = []
    while True:
        block = [next(documents) for _ in range(DOCUMENTS_PER_BLOCK)]
        for ids in tokenizer(block, add_special_tokens=False)["input_ids"]:
            stream.extend(ids)
            stream.extend(separator)
        usable = len(stream) // seq_len * seq_len
        windows = pending + [stream[i:i + seq_len] for i in range(0, usable, seq_len)]
        stream = stream[usable:]
        rng.shuffle(windows)
        full = len(windows) // batch_size * batch_size
        pending = windows[full:]
        for start in range(0, full, batch_size):
            yield torch.tensor(windows[start:start + batch_size], dtype=torch.long)


def learning_rate(step: int, progress: float, recipe: DictConfig) -> float:
    """Linear warm-up over ``warmup_steps``, then cosine decay (by ``progress`` in [0, 1]) to
    ``min_lr_ratio * lr``."""
    train = recipe.train
    if step < train.warmup_steps:
        return train.lr * (step + 1) / train.warmup_steps
    cosine = 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    return train.lr * (train.min_lr_ratio + (1 - train.min_lr_ratio) * cosine)


@torch.no_grad()
def validation_loss(model: torch.nn.Module, windows: torch.Tensor) -> float:
    return math.log(quality.perplexity(model, windows))


def save_checkpoint(model: torch.nn.Module, tokenizer, directory: Path) -> None:
    """Standard HF directory: config, float32 safetensors weights and tokenizer files."""
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory, safe_serialization=True)
    tokenizer.save_pretrained(directory)
    testbed_tokenizer._force_tokenizer_class(directory)
    logger.info("saved %s", directory)


class Progress:
    """Training progress in [0, 1]: by step count, or by wall-clock when ``train.minutes`` is set.

    The wall-clock mode exists because the CPU may be shared: a fixed step count can overrun a
    hard deadline. Data order stays deterministic; only the number of steps taken varies, and it
    is recorded (``train.steps=<N> train.minutes=null`` replays a run exactly).
    """

    def __init__(self, train: DictConfig):
        self.steps = train.get("steps")
        self.minutes = train.get("minutes")
        self.started = time.time()

    def __call__(self, step: int) -> float:
        if self.minutes:
            return (time.time() - self.started) / (60 * self.minutes)
        return step / self.steps


def train(recipe: DictConfig) -> dict:
    """Run the recipe; returns training statistics (also written next to the weights)."""
    torch.set_num_threads(recipe.train.threads)
    tokenizer = testbed_tokenizer.load_tokenizer()
    model = build_model(recipe, tokenizer)
    parameters = sum(p.numel() for p in model.parameters())
    logger.info("%s: %s with %.2fM parameters", recipe.name, recipe.arch, parameters / 1e6)
    train = recipe.train
    output = Path(recipe.output_dir)
    fractions = sorted(float(f) for f in (recipe.get("checkpoint_fractions") or []))
    if output.exists():
        shutil.rmtree(output)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "embed" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and "embed" not in n)]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": train.weight_decay},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=train.lr, betas=tuple(train.betas), eps=1e-8,
    )
    forward = torch.compile(model) if train.get("compile") else model
    validation = quality.test_windows(tokenizer, 120, train.seq_len, split="validation")
    batches = training_batches(tokenizer, train.seq_len, train.batch_size, recipe.seed)
    history, saved_steps = [], []
    progress = Progress(train)
    window_started, window_tokens, window_loss, window_steps = time.time(), 0, 0.0, 0
    tokens_seen, step, last_train_loss = 0, 0, float("nan")

    def evaluate_validation() -> None:
        loss = validation_loss(model, validation)
        history.append({"step": step, "tokens": tokens_seen, "val_loss": loss,
                        "minutes": (time.time() - progress.started) / 60})
        logger.info("step %d: val loss %.4f (ppl %.3f)", step, loss, math.exp(loss))

    while True:
        done = progress(step) >= 1.0
        if fractions and (done or progress(step) >= fractions[0]):
            while fractions and (done or progress(step) >= fractions[0]):
                fractions.pop(0)
            save_checkpoint(model, tokenizer, output / f"step{step}")
            saved_steps.append(step)
        if done:
            break
        if step % train.eval_every == 0:
            evaluate_validation()
        model.train()
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, progress(step), recipe)
        batch = next(batches)
        loss = forward(input_ids=batch, labels=batch, use_cache=False).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), train.grad_clip)
        optimizer.step()
        step += 1
        tokens_seen += batch.numel()
        window_tokens += batch.numel()
        window_loss += loss.item()
        window_steps += 1
        if step % train.log_every == 0:
            elapsed = time.time() - window_started
            last_train_loss = window_loss / window_steps
            logger.info("step %d (%.1f%%) loss %.4f lr %.2e %.0f tok/s elapsed %.1f min",
                        step, 100 * progress(step), last_train_loss,
                        optimizer.param_groups[0]["lr"], window_tokens / elapsed,
                        (time.time() - progress.started) / 60)
            window_started, window_tokens, window_loss, window_steps = time.time(), 0, 0.0, 0
    wall_minutes = (time.time() - progress.started) / 60
    evaluate_validation()
    if not saved_steps:
        save_checkpoint(model, tokenizer, output)
    stats = {
        "name": recipe.name, "arch": recipe.arch, "parameters": parameters,
        "corpus_version": corpus.CORPUS_VERSION, "steps": step,
        "tokens": tokens_seen, "wall_minutes": wall_minutes,
        "tokens_per_second": tokens_seen / max(1e-9, wall_minutes * 60),
        "final_train_loss": last_train_loss, "final_val_loss": history[-1]["val_loss"],
        "history": history, "checkpoint_steps": saved_steps,
        "recipe": OmegaConf.to_container(recipe, resolve=True),
    }
    (output / "training_stats.json").write_text(json.dumps(stats, indent=2) + "\n")
    logger.info("done: %d steps, %d tokens, %.1f min", step, tokens_seen, wall_minutes)
    return stats


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    recipe_args = [a for a in argv if a.startswith("recipe=")]
    if not recipe_args:
        raise SystemExit("usage: python -m prunelab.testbed.train recipe=<name> [key=value ...]")
    recipe = load_recipe(recipe_args[-1].split("=", 1)[1],
                         [a for a in argv if not a.startswith("recipe=")])
    logger.info("recipe:\n%s", OmegaConf.to_yaml(recipe))
    train(recipe)
    if recipe.get("evaluate", True):
        from prunelab.testbed import model_card
        model_card.write_cards(Path(recipe.output_dir))


if __name__ == "__main__":
    main()
