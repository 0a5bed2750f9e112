"""The allocation contract: per-layer sparsities whose mean is the target."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from prunelab.models.loading import LoadedModel


@dataclass
class AllocationContext:
    """What a policy may look at: the dense model and the run's seed (calibration comes later)."""

    loaded: LoadedModel
    seed: int


class Allocation(Protocol):
    name: str

    def allocate(self, target: float, ctx: AllocationContext) -> list[float]:
        """One sparsity per decoder layer."""
