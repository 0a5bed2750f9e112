"""Uniform allocation: every decoder layer at the target sparsity. Select with
`pruning/allocation=uniform` (the default)."""

from __future__ import annotations

from prunelab.pruning.base import PruneContext


class Uniform:
    name = "uniform"

    def allocate(self, target: float, ctx: PruneContext) -> list[float]:
        return [target] * ctx.loaded.adapter.num_layers
