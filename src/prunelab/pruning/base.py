"""The contract between the pipeline and a pruning method: a first stage named for its work, then
`prune`. The pipeline times and records each stage under its name.

- Weight pruning (magnitude, Wanda, SparseGPT, dense): `allocate(ctx)` returns the target sparsity
  of each decoder layer (the allocation policy, with any dense calibration pass it needs); `prune`
  then scores and masks the weights. Wanda's and SparseGPT's scores depend on the already-pruned
  earlier layers (and SparseGPT's mask on its updated weights), so they are computed layer by layer
  inside `prune`.
- Layer removal (depth pruning): `score(ctx)` rates the dense model's layers (SLEB also searches
  its removal order there); `prune` selects the layers and removes them.
- Width pruning (FLAP, Wanda-sp, magnitude-sp) has the same shape: `score(ctx)` takes FLAP's dense
  statistics (Wanda-sp and magnitude-sp only plan the per-layer counts: their scores depend on the
  pruned earlier layers); `prune` cuts heads and channels out of the modules.

A method that cannot prune some models (SliceGPT: post-norms; width pruning: a single key/value
head per layer) also has `check_model(adapter, name=None)`, raising the one-line
`UnsupportedModelError`: the pipeline (and `prunelab.prune`) calls it right after the model is
loaded, before the dense evaluation or any calibration pass.

The context read and the report returned are `prunelab.context.PruneContext` and `PruneReport`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from prunelab.context import PruneContext, PruneReport
from prunelab.pruning.scorers.base import LayerScores


@runtime_checkable
class WeightPruning(Protocol):
    name: str

    def labels(self) -> dict[str, Any]:
        """Short labels for tables (method, sparsity, sparsity_type, allocation, ...)."""

    def allocate(self, ctx: PruneContext) -> list[float]:
        """One target sparsity per decoder layer."""

    def prune(self, ctx: PruneContext, layer_targets: list[float]) -> PruneReport:
        """Score and mask the weights of ctx.loaded.model in place."""


@runtime_checkable
class LayerRemoval(Protocol):
    name: str

    def labels(self) -> dict[str, Any]:
        """Short labels for tables (method, scorer, selector, layers_removed)."""

    def score(self, ctx: PruneContext) -> LayerScores:
        """Importance of the dense model's layers (or blocks, or a removal order)."""

    def prune(self, ctx: PruneContext, scores: LayerScores) -> PruneReport:
        """Select the layers to remove and remove them from ctx.loaded.model."""


PruningMethod = WeightPruning | LayerRemoval


def first_stage(method: PruningMethod) -> tuple[str, Callable[[PruneContext], Any]]:
    """The stage before `prune` and its name: ("allocate", method.allocate) for weight pruning,
    ("score", method.score) for layer removal."""
    if isinstance(method, WeightPruning):
        return "allocate", method.allocate
    if isinstance(method, LayerRemoval):
        return "score", method.score
    raise TypeError(f"{type(method).__name__} has neither allocate(ctx) nor score(ctx)")
