"""The contract between the pipeline and a pruning method.

A method scores (weights or layers) and then prunes; data-aware sequential methods (SparseGPT)
do both per layer inside `prune` and return nothing from `score`. Calibration samples are drawn
lazily, so data-free methods never touch a data set.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from prunelab.models.loading import LoadedModel


@dataclass
class PruneContext:
    loaded: LoadedModel
    seed: int
    calibration: Callable[[], torch.Tensor]  # -> [nsamples, seqlen] token ids, drawn on first call
    batch_size: int = 1
    progress: bool = True
    cache_dir: Path | None = None  # for dense statistics shared across a sweep (allocation inputs)


@dataclass
class PruneReport:
    """What a method did, for the record.

    Attributes:
        layer_targets: target sparsity of each decoder layer (weight pruning), or None.
        removed_layers: indices of removed decoder layers (depth pruning), or empty.
        details: method-specific output for the record (JSON-able: layer scores, allocation
            inputs, similarity matrices).
        dense_layers: depth pruning keeps the unpruned layer list here, so a recovery can compute
            the dense model's boundary activations (`adapter.layers_replaced(dense_layers)`).
    """

    layer_targets: list[float] | None = None
    removed_layers: list[int] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    dense_layers: list[nn.Module] | None = None


class PruningMethod(Protocol):
    name: str

    def labels(self) -> dict[str, Any]:
        """Short labels for tables (method, sparsity, sparsity_type, allocation, ...)."""

    def score(self, ctx: PruneContext) -> Any:
        """Importance scores, or None for methods that score while pruning."""

    def prune(self, ctx: PruneContext, scores: Any) -> PruneReport:
        """Modify ctx.loaded.model in place."""
