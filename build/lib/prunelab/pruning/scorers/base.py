"""The contract between `DepthPruning` and a layer scorer.

A scorer rates the decoder layers of the loaded (dense) model; a selector (`pruning.selectors`)
turns the rating into the set of layers to remove. Scores are importances: LOWER = removed first.
A scorer can give per-layer scores, scores of contiguous blocks of the requested size (by start
layer), a removal order (iterative methods that select while scoring, such as SLEB) or an all-pairs
similarity matrix (higher = more redundant, for the cluster selector).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from prunelab.context import PruneContext


@dataclass(frozen=True)
class ScoreRequest:
    num_layers: int  # decoder layers of the dense model
    num_remove: int  # how many the method will remove (block size for block scorers)
    protected: frozenset[int] = frozenset()  # layers no selection may remove


@dataclass
class LayerScores:
    per_layer: list[float] | None = None  # [L] importance per layer
    block_starts: list[float | None] | None = None  # [L] importance of block [j, j + n), None if invalid
    order: list[int] | None = None  # removal order of an iterative scorer
    pairwise: list[list[float]] | None = None  # [L, L] similarity, higher = more redundant
    details: dict[str, Any] = field(default_factory=dict)  # JSON-able extras for the record

    def record(self) -> dict[str, Any]:
        """What goes into the run record: `layer_scores` (per layer, or per block start), extras."""
        out: dict[str, Any] = dict(self.details)
        if self.per_layer is not None:
            out["layer_scores"] = json_floats(self.per_layer)
        elif self.block_starts is not None:
            out["layer_scores"] = json_floats(self.block_starts)
            out["layer_scores_kind"] = "block_start"
        if self.block_starts is not None:
            out["block_scores"] = json_floats(self.block_starts)
        if self.order is not None:
            out["removal_order"] = list(self.order)
        if self.pairwise is not None:
            out["pairwise"] = [json_floats(row) for row in self.pairwise]
        return out


class LayerScorer(Protocol):
    name: str
    selectors: tuple[str, ...]  # selectors this scorer's output supports; the first is its own
    plus_rule: bool  # the reference's default for Shortened-LLaMA's "+" protection

    def score(self, ctx: PruneContext, request: ScoreRequest) -> LayerScores: ...


def json_floats(values) -> list[float | None]:
    """Floats for JSON: tensors to lists, NaN and infinities to None."""
    if isinstance(values, torch.Tensor):
        values = values.tolist()
    return [None if v is None or not math.isfinite(float(v)) else float(v) for v in values]
