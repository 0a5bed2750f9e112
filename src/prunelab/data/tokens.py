"""Token tensors for calibration and evaluation, cached on disk by content key.

Calibration (SparseGPT/Wanda/OWL protocol): `random.Random(seed)` reproduces the references'
`random.seed(seed)` draws. C4: per sample, draw documents until one is longer than `seqlen` tokens,
then a random `seqlen` window of it. Other corpora: tokenize the joined split once and draw random
windows. Evaluation: the joined test split tokenized once (C4 validation: first 1100 documents,
truncated to 256 x seqlen tokens).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
from tqdm.auto import tqdm

from prunelab.data import sources
from prunelab.data.spec import CalibrationSpec
from prunelab.errors import DataUnavailableError

log = logging.getLogger(__name__)


def tokenizer_fingerprint(tokenizer) -> str:
    """Hash of the tokenizer's full definition, so caches never mix tokenizers."""
    backend = getattr(tokenizer, "backend_tokenizer", None) or getattr(tokenizer, "_tokenizer", None)
    text = backend.to_str() if backend is not None else f"{tokenizer.name_or_path}:{len(tokenizer)}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class TokenCache:
    """Tensors stored as `<root>/<key>.pt`, key = sha256 of the JSON of what produced them."""

    def __init__(self, root: str | Path | None):
        self.root = Path(root).expanduser() if root else None

    def get_or_compute(self, recipe: dict, compute: Callable[[], torch.Tensor]) -> torch.Tensor:
        if self.root is None:
            return compute()
        key = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:24]
        path = self.root / f"{key}.pt"
        if path.exists():
            return torch.load(path)
        value = compute()
        self.root.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.root, suffix=".tmp")
        os.close(fd)
        torch.save(value, tmp)
        os.replace(tmp, path)
        return value


def encode(tokenizer, text: str) -> torch.Tensor:
    """[1, L] token ids, special tokens as the tokenizer adds them (the references' behaviour)."""
    return tokenizer(text, return_tensors="pt").input_ids


def calibration_samples(
    spec: CalibrationSpec, tokenizer, seed: int, cache: TokenCache | None = None
) -> torch.Tensor:
    """[nsamples, seqlen] token ids drawn with the calibration seed."""
    recipe = {
        "kind": "calibration", "source": spec.source, "nsamples": spec.nsamples, "seqlen": spec.seqlen,
        "seed": seed, "tokenizer": tokenizer_fingerprint(tokenizer),
        "version": sources.corpus_version(spec.source, spec.paths),
    }
    return (cache or TokenCache(None)).get_or_compute(recipe, lambda: _draw(spec, tokenizer, seed))


def _draw(spec: CalibrationSpec, tokenizer, seed: int) -> torch.Tensor:
    rng = random.Random(seed)
    docs = sources.documents(spec.source, "train", spec.paths)
    samples = []
    if spec.source == "c4":
        for _ in tqdm(range(spec.nsamples), desc="calibration samples", leave=False):
            while True:
                ids = encode(tokenizer, docs[rng.randint(0, len(docs) - 1)])
                if ids.shape[1] > spec.seqlen:
                    break
            start = rng.randint(0, ids.shape[1] - spec.seqlen - 1)
            samples.append(ids[:, start : start + spec.seqlen])
    else:
        joiner = sources.JOINERS.get((spec.source, "train"), sources.DEFAULT_JOINER)
        ids = encode(tokenizer, joiner.join(docs))
        if ids.shape[1] <= spec.seqlen + 1:
            raise DataUnavailableError(
                f"{spec.source} train text has {ids.shape[1]} tokens, too few for seqlen {spec.seqlen}"
            )
        for _ in range(spec.nsamples):
            start = rng.randint(0, ids.shape[1] - spec.seqlen - 1)
            samples.append(ids[:, start : start + spec.seqlen])
    return torch.cat(samples, dim=0)  # [nsamples, seqlen]


def eval_token_stream(
    corpus: str, tokenizer, seqlen: int, paths: tuple[str, ...] = (), cache: TokenCache | None = None
) -> torch.Tensor:
    """[1, L] token ids of a test split, joined and tokenized once."""
    split = "validation" if corpus == "c4" else "test"
    recipe = {
        "kind": "eval", "corpus": corpus, "split": split, "tokenizer": tokenizer_fingerprint(tokenizer),
        "seqlen": seqlen if corpus == "c4" else None,
        "version": sources.corpus_version(corpus, paths),
    }

    def compute() -> torch.Tensor:
        docs = sources.documents(corpus, split, paths)
        ids = encode(tokenizer, sources.JOINERS.get((corpus, split), sources.DEFAULT_JOINER).join(docs))
        return ids[:, : 256 * seqlen] if corpus == "c4" else ids

    return (cache or TokenCache(None)).get_or_compute(recipe, compute)
