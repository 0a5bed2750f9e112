"""Token tensors for calibration and evaluation, cached on disk by content key.

Calibration (SparseGPT/Wanda/OWL protocol): `random.Random(seed)` reproduces the references'
`random.seed(seed)` draws. C4: per sample, draw documents until one is longer than `seqlen` tokens,
then a random `seqlen` window of it. Other corpora: tokenize the joined split once and draw random
windows. Evaluation: the joined test split tokenized once (C4 validation: first 1100 documents,
truncated to 256 x seqlen tokens).
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import pickle
import random
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save
from tqdm.auto import tqdm

from prunelab.data import sources
from prunelab.data.spec import CalibrationSpec
from prunelab.errors import DataUnavailableError
from prunelab.files import atomic_write

log = logging.getLogger(__name__)


def tokenizer_fingerprint(tokenizer) -> str:
    """Hash of the tokenizer's full definition, so caches never mix tokenizers."""
    backend = getattr(tokenizer, "backend_tokenizer", None) or getattr(tokenizer, "_tokenizer", None)
    text = backend.to_str() if backend is not None else f"{tokenizer.name_or_path}:{len(tokenizer)}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class TokenCache:
    """Tensors stored as `<root>/<key>.safetensors`, key = sha256 of the JSON of what produced them.

    Each file carries its recipe and the sha256 of its tensor; a truncated, edited or foreign file
    is noticed on read (one warning line) and rebuilt. No pickle is ever loaded.
    """

    def __init__(self, root: str | Path | None):
        self.root = Path(root).expanduser() if root else None

    def get_or_compute(self, recipe: dict, compute: Callable[[], torch.Tensor]) -> torch.Tensor:
        if self.root is None:
            return compute()
        recipe_json = json.dumps(recipe, sort_keys=True)
        path = self.root / f"{hashlib.sha256(recipe_json.encode()).hexdigest()[:24]}.safetensors"
        if path.exists():
            value, problem = _read_checked(path, recipe_json)
            if value is not None:
                return value
            log.warning("token cache %s %s: rebuilt", path, problem)
        value = compute()
        metadata = {"recipe": recipe_json, "sha256": tensor_sha256(value)}
        atomic_write(path, lambda handle: handle.write(save(
            {"ids": value.contiguous()}, metadata=metadata)), "the token cache")
        return value


def tensor_sha256(value: torch.Tensor) -> str:
    digest = hashlib.sha256(f"{tuple(value.shape)}:{value.dtype}".encode())
    digest.update(value.contiguous().numpy().tobytes())
    return digest.hexdigest()


def _read_checked(path: Path, recipe_json: str) -> tuple[torch.Tensor | None, str]:
    """(tensor, "") when the file is whole and made by this recipe, else (None, what is wrong)."""
    try:
        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata() or {}
            value = handle.get_tensor("ids")
    except Exception as err:  # truncated or not a safetensors file
        return None, f"is unreadable ({type(err).__name__})"
    if metadata.get("recipe") != recipe_json:
        return None, "was made by another recipe"
    if metadata.get("sha256") != tensor_sha256(value):
        return None, "does not match its checksum (edited or damaged)"
    return value, ""


#: Texts this long or longer are tokenized in a child process while `tokenize_long_texts_in_child` is on.
CHILD_MIN_CHARS = 200_000
_long_texts_in_child = False


def tokenize_long_texts_in_child(enabled: bool) -> bool:
    """Tokenize texts of `CHILD_MIN_CHARS` or more in a short-lived child process (a streamed run
    turns this on); returns the previous setting.

    A fast tokenizer encodes a text in about 300 bytes a token of small allocations (3 million
    characters: about 210 MiB). Freed, they stay in this process's heap, whose size a data limit
    (`prlimit --data`, `ulimit -d`) counts for the rest of the run; a child returns them to the OS
    when it exits. The ids are the same (the same tokenizer, pickled); it costs a few seconds of
    start-up, once per text (the token cache keeps the result)."""
    global _long_texts_in_child
    previous, _long_texts_in_child = _long_texts_in_child, enabled
    return previous


def encode(tokenizer, text: str) -> torch.Tensor:
    """[1, L] token ids, special tokens as the tokenizer adds them (the references' behaviour)."""
    if _long_texts_in_child and len(text) >= CHILD_MIN_CHARS:
        try:
            return torch.from_numpy(_encode_in_child(tokenizer, text))  # [1, L]
        except Exception as err:  # a tokenizer that does not pickle, no process to spare, ...
            log.warning("tokenizing in a child process failed (%s: %s): tokenizing here",
                        type(err).__name__, err)
    return _encode_here(tokenizer, text)


def _encode_here(tokenizer, text: str) -> torch.Tensor:
    return tokenizer(text, return_tensors="pt", verbose=False).input_ids  # long on purpose: no warning


def _encode_in_child(tokenizer, text: str) -> np.ndarray:
    """[1, L] int64 ids from `python -m prunelab.data.tokenize_child`."""
    payload = pickle.dumps((tokenizer, text), protocol=pickle.HIGHEST_PROTOCOL)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}  # as this process finds prunelab
    done = subprocess.run([sys.executable, "-m", "prunelab.data.tokenize_child"], input=payload,
                          capture_output=True, check=False, env=env)
    if done.returncode != 0:
        last = (done.stderr.decode(errors="replace").strip().splitlines() or ["no message"])[-1]
        raise RuntimeError(f"exit {done.returncode}: {last}")
    return np.load(io.BytesIO(done.stdout), allow_pickle=False)


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
        return random_windows(encode(tokenizer, joiner.join(docs)), spec.nsamples, spec.seqlen, rng,
                              f"{spec.source} train text")
    return torch.cat(samples, dim=0)  # [nsamples, seqlen]


def random_windows(ids: torch.Tensor, nsamples: int, seqlen: int, rng: random.Random,
                   what: str = "the calibration text") -> torch.Tensor:
    """[nsamples, seqlen] windows at random starts of one token stream ids [1, L] (the references'
    draw for a joined corpus)."""
    if ids.shape[1] <= seqlen + 1:
        raise DataUnavailableError(f"{what} has {ids.shape[1]} tokens, too few for windows of "
                                   f"{seqlen}; give more text or a smaller seqlen")
    starts = [rng.randint(0, ids.shape[1] - seqlen - 1) for _ in range(nsamples)]
    return torch.cat([ids[:, s : s + seqlen] for s in starts], dim=0)  # [nsamples, seqlen]


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
