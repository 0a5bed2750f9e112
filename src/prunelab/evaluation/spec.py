"""Typed form of the `evaluation` config group: which evaluators run, with which protocol."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from prunelab.evaluation.efficiency import EfficiencySpec
from prunelab.evaluation.perplexity import PerplexitySpec
from prunelab.evaluation.zeroshot import ZeroShotSpec


@dataclass(frozen=True)
class EvaluationSpec:
    perplexity: PerplexitySpec | None = None
    zeroshot: ZeroShotSpec | None = None
    efficiency: EfficiencySpec = EfficiencySpec(measure="never")

    def __post_init__(self) -> None:
        if isinstance(self.perplexity, Mapping):
            object.__setattr__(self, "perplexity", PerplexitySpec(**self.perplexity))
        if isinstance(self.zeroshot, Mapping):
            object.__setattr__(self, "zeroshot", ZeroShotSpec(**self.zeroshot))
        if isinstance(self.efficiency, Mapping):
            object.__setattr__(self, "efficiency", EfficiencySpec(**self.efficiency))
