"""The allocation contract: per-layer sparsities whose mean is the target.

A policy may look at the dense model and the calibration data (`ctx.calibration()`); what it
measured (outlier ratios, percentiles, gradients, alphas) it leaves in `details` for the record.
"""

from __future__ import annotations

from typing import Any, Protocol

from prunelab.context import PruneContext


class Allocation(Protocol):
    name: str
    details: dict[str, Any]

    def allocate(self, target: float, ctx: PruneContext) -> list[float]:
        """One sparsity per decoder layer."""


def allocation_details(allocation: Allocation, targets: list[float]) -> dict[str, Any]:
    """What the record keeps of an allocation: its name, the targets and its raw statistics."""
    return {"policy": allocation.name, "layer_targets": [float(t) for t in targets],
            **getattr(allocation, "details", {})}
