"""Magnitude pruning: remove the weights of smallest |W|. Data-free baseline.

Han et al., "Learning both Weights and Connections for Efficient Neural Networks", 2015; as run in
the Wanda repository (`--prune_method magnitude`). Score |W_ij|; one threshold per weight matrix
(`group: matrix`, the reference default); N:M prunes the n smallest of every m consecutive inputs.
Layer-wise targets come from `pruning/allocation` (uniform by default).
Quirks: the reference prunes every score <= the k-th smallest (k + 1 entries, plus ties); the
faithful default prunes exactly k, `ties: reference` prunes like the reference. `rounding: carry`
(the default) keeps the overall sparsity on target under non-uniform allocations and compensates the
extra zeros, `rounding: floor` is the reference's per-layer rounding (see `pruning.budget`). Only
`ties: reference` with `rounding: floor` reproduces the reference's masks (measured: 0 differing
mask entries that way, 125 to 309 with `ties: reference` alone). Select with `pruning=magnitude`.
"""

from __future__ import annotations

from typing import Any

import torch

from prunelab.allocation.base import Allocation, allocation_details
from prunelab.allocation.uniform import Uniform
from prunelab.calibration.dense_statistics import DenseStatistics
from prunelab.context import PruneContext, PruneReport
from prunelab.pruning.budget import SparsityBudget, check_method_settings
from prunelab.pruning.masks import apply_mask, make_mask
from prunelab.scoring.weights import magnitude_scores


class Magnitude:
    name = "magnitude"

    def __init__(self, sparsity: float = 0.5, sparsity_type: str = "unstructured", group: str = "matrix",
                 ties: str = "exact", rounding: str = "carry", allocation: Allocation | None = None):
        self.allocation = allocation or Uniform()
        check_method_settings(sparsity, sparsity_type, group, ties, "pruned", rounding, self.allocation,
                              sparsity)
        self.sparsity, self.sparsity_type, self.group = sparsity, sparsity_type, group
        self.ties, self.rounding = ties, rounding

    def labels(self) -> dict[str, Any]:
        return {"method": self.name, "sparsity": self.sparsity, "sparsity_type": self.sparsity_type,
                "allocation": self.allocation.name}

    def allocate(self, ctx: PruneContext) -> list[float]:
        """Per-layer targets from the allocation policy; |W| is scored per matrix in `prune`."""
        return self.allocation.allocate(self.sparsity, DenseStatistics(ctx))

    @torch.no_grad()
    def prune(self, ctx: PruneContext, layer_targets: list[float]) -> PruneReport:
        adapter = ctx.loaded.adapter
        budget = SparsityBudget(self.rounding)
        for index, layer in enumerate(adapter.layers):
            for linear in adapter.linears(layer).values():
                scores = magnitude_scores(linear.weight)  # [out, in]
                ratio = budget.ratio(layer_targets[index], scores.shape, self.group)
                apply_mask(linear.weight, make_mask(scores, ratio, self.sparsity_type, self.group, self.ties))
                budget.record(layer_targets[index], linear.weight)
        return PruneReport(layer_targets=list(layer_targets),
                           details={"allocation": allocation_details(self.allocation, layer_targets)})
