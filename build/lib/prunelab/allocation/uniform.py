"""Uniform allocation: every decoder layer at the target sparsity. Select with
`pruning/allocation=uniform` (the default)."""

from __future__ import annotations

from typing import Any

from prunelab.calibration.dense_statistics import DenseStatistics


class Uniform:
    name = "uniform"
    details: dict[str, Any] = {}

    def allocate(self, target: float, stats: DenseStatistics) -> list[float]:
        return [target] * stats.num_layers
