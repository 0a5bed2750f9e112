"""What a run hands to its pruning, allocation and recovery stages, and what pruning reports back.

`PruneContext` is built once by the pipeline and read by every stage after loading: the pruning
method, the allocation policy and the recovery. `PruneReport`
is what pruning returns; the recovery and the record read it. Both live here, outside `pruning/`, so
that allocation and recovery can import them without importing any pruning method.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from prunelab.models.loading import LoadedModel


@dataclass
class PruneContext:
    """The loaded model and how to get calibration data. Samples are drawn lazily, on the first
    call of `calibration`, so data-free methods never touch a data set."""

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
