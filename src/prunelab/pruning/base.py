"""The contract between the pipeline and a pruning method.

A method scores (weights or layers) and then prunes; data-aware sequential methods (SparseGPT)
do both per layer inside `prune` and return nothing from `score`. The context it reads and the report
it returns are `prunelab.context.PruneContext` and `PruneReport`.
"""

from __future__ import annotations

from typing import Any, Protocol

from prunelab.context import PruneContext, PruneReport


class PruningMethod(Protocol):
    name: str

    def labels(self) -> dict[str, Any]:
        """Short labels for tables (method, sparsity, sparsity_type, allocation, ...)."""

    def score(self, ctx: PruneContext) -> Any:
        """Importance scores, or None for methods that score while pruning."""

    def prune(self, ctx: PruneContext, scores: Any) -> PruneReport:
        """Modify ctx.loaded.model in place."""
