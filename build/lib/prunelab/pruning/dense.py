"""Dense: no pruning. The reference row of every table. Select with `pruning=dense`."""

from __future__ import annotations

from typing import Any

from prunelab.context import PruneContext, PruneReport


class Dense:
    name = "dense"

    def labels(self) -> dict[str, Any]:
        return {"method": "dense", "sparsity": 0.0}

    def allocate(self, ctx: PruneContext) -> list[float]:
        return [0.0] * ctx.loaded.adapter.num_layers

    def prune(self, ctx: PruneContext, layer_targets: list[float]) -> PruneReport:
        return PruneReport(layer_targets=list(layer_targets))
