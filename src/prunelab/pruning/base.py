"""The contract between the pipeline and a pruning method.

A method scores (weights or layers) and then prunes; data-aware sequential methods (SparseGPT)
do both per layer inside `prune` and return nothing from `score`. Calibration samples are drawn
lazily, so data-free methods never touch a data set.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from prunelab.models.loading import LoadedModel


@dataclass
class PruneContext:
    loaded: LoadedModel
    seed: int
    calibration: Callable[[], torch.Tensor]  # -> [nsamples, seqlen] token ids, drawn on first call
    batch_size: int = 1
    progress: bool = True


@dataclass
class PruneReport:
    """What a method did, for the record.

    Attributes:
        layer_targets: target sparsity of each decoder layer (weight pruning), or None.
        removed_layers: indices of removed decoder layers (depth pruning), or empty.
        details: method-specific output (scores, allocation inputs, similarity matrices).
    """

    layer_targets: list[float] | None = None
    removed_layers: list[int] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)


class PruningMethod(Protocol):
    name: str

    def labels(self) -> dict[str, Any]:
        """Short labels for tables (method, sparsity, sparsity_type, allocation, ...)."""

    def score(self, ctx: PruneContext) -> Any:
        """Importance scores, or None for methods that score while pruning."""

    def prune(self, ctx: PruneContext, scores: Any) -> PruneReport:
        """Modify ctx.loaded.model in place."""
