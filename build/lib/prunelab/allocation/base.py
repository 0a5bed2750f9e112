"""The allocation contract: per-layer sparsities whose mean is the target.

A policy reads the dense model's statistics (`calibration.dense_statistics.DenseStatistics`: layer
sizes, weights, calibration passes, cached) and maps them to sparsities; it never walks the model
itself. What it measured (outlier ratios, percentiles, gradients, alphas) it leaves in `details`
for the record.
"""

from __future__ import annotations

from typing import Any, Protocol

from prunelab.calibration.dense_statistics import DenseStatistics


class Allocation(Protocol):
    name: str
    details: dict[str, Any]

    def allocate(self, target: float, stats: DenseStatistics) -> list[float]:
        """One sparsity per decoder layer."""


def allocation_details(allocation: Allocation, targets: list[float]) -> dict[str, Any]:
    """What the record keeps of an allocation: its name, the targets and its raw statistics."""
    return {"policy": allocation.name, "layer_targets": [float(t) for t in targets],
            **getattr(allocation, "details", {})}
