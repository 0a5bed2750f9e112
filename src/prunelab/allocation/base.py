"""The allocation contract: per-layer sparsities whose mean is the target.

A policy may look at the dense model and the calibration data (`ctx.calibration()`); what it
measured goes into `details` for the record.
"""

from __future__ import annotations

from typing import Protocol

from prunelab.pruning.base import PruneContext


class Allocation(Protocol):
    name: str

    def allocate(self, target: float, ctx: PruneContext) -> list[float]:
        """One sparsity per decoder layer."""
