"""The testbed's language as a prunelab corpus (`data=testbed`, `data.eval_corpora=[testbed]`).

`prunelab.data` knows no testbed: this module registers it through the `prunelab.corpora` entry
point (pyproject.toml), the way any package adds a corpus, so the dependency runs from the testbed
down to `data` and not back up.
"""

from __future__ import annotations

from prunelab.data.sources import Corpus
from prunelab.testbed import corpus

#: Documents of each split that calibration and evaluation read (the first ones, deterministic).
DOCUMENTS = {"train": 4000, "validation": 1000, "test": 1000}


def _documents(split: str) -> list[str]:
    return corpus.documents(split, DOCUMENTS[split])


def _version() -> str:
    return corpus.CORPUS_VERSION


CORPUS = Corpus(documents=_documents, version=_version)
