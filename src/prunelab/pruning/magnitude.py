"""Magnitude pruning: remove the weights of smallest |W|. Data-free baseline.

Han et al., "Learning both Weights and Connections for Efficient Neural Networks", 2015; as run in
the Wanda repository (`--prune_method magnitude`). Score |W_ij|; one threshold per weight matrix
(`group: matrix`, the reference default); N:M prunes the n smallest of every m consecutive inputs.
Layer-wise targets come from `pruning/allocation` (uniform by default).
The defaults are the reference's rules: every score <= the k-th smallest is pruned (k + 1 entries,
plus ties: `ties: reference`) and each layer's target is used as is (`rounding: floor`); measured
against an independent implementation over all 30 layers of SmolLM2-135M at 50% and 2:4: 0
differing mask entries (results/benchmarks/faithful_masks.md). Switches: `ties: exact` prunes
exactly k, `rounding: carry` keeps the overall sparsity on target under non-uniform allocations
(see `pruning.budget`). Select with `pruning=magnitude`.
"""

from __future__ import annotations

from typing import Any

import torch

from prunelab.allocation.base import Allocation, allocation_details
from prunelab.allocation.uniform import Uniform
from prunelab.calibration.dense_statistics import DenseStatistics
from prunelab.calibration.passes import layer_pass, role_linears
from prunelab.context import PruneContext, PruneReport
from prunelab.pruning.budget import SparsityBudget, check_method_settings
from prunelab.pruning.dsnot import DSnoT, refine_statistics
from prunelab.pruning.masks import apply_mask, make_mask
from prunelab.scoring.weights import magnitude_scores


class Magnitude:
    name = "magnitude"

    def __init__(self, sparsity: float = 0.5, sparsity_type: str = "unstructured", group: str = "matrix",
                 ties: str = "reference", rounding: str = "floor", allocation: Allocation | None = None,
                 refine: DSnoT | None = None):
        self.allocation = allocation or Uniform()
        check_method_settings(sparsity, sparsity_type, group, ties, "pruned", rounding, self.allocation,
                              sparsity)
        self.sparsity, self.sparsity_type, self.group = sparsity, sparsity_type, group
        self.ties, self.rounding = ties, rounding
        self.refine = refine
        if refine is not None:
            refine.check_base(self.name, sparsity_type)

    def labels(self) -> dict[str, Any]:
        labels = {"method": self.name, "sparsity": self.sparsity, "sparsity_type": self.sparsity_type,
                  "allocation": self.allocation.name}
        return {**labels, "refine": self.refine.name} if self.refine else labels

    def allocate(self, ctx: PruneContext) -> list[float]:
        """Per-layer targets from the allocation policy; |W| is scored per matrix in `prune`."""
        return self.allocation.allocate(self.sparsity, DenseStatistics(ctx))

    @torch.no_grad()
    def prune(self, ctx: PruneContext, layer_targets: list[float]) -> PruneReport:
        if self.refine:
            return self.prune_refined(ctx, layer_targets)
        adapter = ctx.loaded.adapter
        budget = SparsityBudget(self.rounding)
        for index, layer in adapter.layers_in_memory():  # streamed: one layer read at a time
            for linear in adapter.linears(layer).values():
                scores = magnitude_scores(linear.weight)  # [out, in]
                ratio = budget.ratio(layer_targets[index], scores.shape, self.group)
                apply_mask(linear.weight, make_mask(scores, ratio, self.sparsity_type, self.group, self.ties))
                budget.record(layer_targets[index], linear.weight)
        return PruneReport(layer_targets=list(layer_targets),
                           details={"allocation": allocation_details(self.allocation, layer_targets)})

    @torch.no_grad()
    def prune_refined(self, ctx: PruneContext, layer_targets: list[float]) -> PruneReport:
        """|W| masks refined layer by layer: the refinement needs each layer's inputs after the
        earlier layers were pruned (the reference's loop), so this pass is calibrated."""
        adapter = ctx.loaded.adapter
        budget = SparsityBudget(self.rounding)
        self.refine.start()
        for step in layer_pass(adapter, ctx.calibration(), ctx.batch_size, "pruned", ctx.progress,
                               desc="magnitude+dsnot"):
            groups = role_linears(adapter, step.layer)
            with refine_statistics(self.refine, groups) as moments:
                step.forward()
            for role, group in groups.items():
                for name, linear in group.items():
                    scores = magnitude_scores(linear.weight)  # [out, in]
                    ratio = budget.ratio(layer_targets[step.index], scores.shape, self.group)
                    mask = make_mask(scores, ratio, self.sparsity_type, self.group, self.ties)
                    mask = self.refine.refine(f"layers.{step.index}.{name}", role, linear.weight, mask,
                                              moments[role])
                    apply_mask(linear.weight, mask)
                    budget.record(layer_targets[step.index], linear.weight)
        return PruneReport(layer_targets=list(layer_targets),
                           details={"allocation": allocation_details(self.allocation, layer_targets),
                                    "refine": self.refine.details()})
