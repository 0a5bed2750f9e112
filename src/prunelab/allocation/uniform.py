"""Uniform allocation: every decoder layer at the target sparsity. Select with
`pruning/allocation=uniform` (the default)."""

from __future__ import annotations

from prunelab.allocation.base import AllocationContext


class Uniform:
    name = "uniform"

    def allocate(self, target: float, ctx: AllocationContext) -> list[float]:
        return [target] * ctx.loaded.adapter.num_layers
