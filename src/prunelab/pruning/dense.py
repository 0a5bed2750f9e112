"""Dense: no pruning. The reference row of every table. Select with `pruning=dense`."""

from __future__ import annotations

from typing import Any

from prunelab.context import PruneContext, PruneReport


class Dense:
    name = "dense"

    def labels(self) -> dict[str, Any]:
        return {"method": "dense", "sparsity": 0.0}

    def score(self, ctx: PruneContext) -> None:
        return None

    def prune(self, ctx: PruneContext, scores: None) -> PruneReport:
        return PruneReport(layer_targets=[0.0] * ctx.loaded.adapter.num_layers)
