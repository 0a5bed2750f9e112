"""Uniform allocation: every decoder layer at the target sparsity. Select with
`pruning/allocation=uniform` (the default)."""

from __future__ import annotations

from typing import Any

from prunelab.context import PruneContext


class Uniform:
    name = "uniform"
    details: dict[str, Any] = {}

    def allocate(self, target: float, ctx: PruneContext) -> list[float]:
        return [target] * ctx.loaded.adapter.num_layers
