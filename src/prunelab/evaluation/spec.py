"""Typed form of the `evaluation` config group: which evaluators run, with which protocol."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from prunelab.evaluation.perplexity import PerplexitySpec


@dataclass(frozen=True)
class EvaluationSpec:
    perplexity: PerplexitySpec | None = None
    zeroshot: Any = None  # ZeroShotSpec, when the zero-shot evaluator is configured

    def __post_init__(self) -> None:
        if isinstance(self.perplexity, Mapping):
            object.__setattr__(self, "perplexity", PerplexitySpec(**self.perplexity))
