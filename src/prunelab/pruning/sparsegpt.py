"""SparseGPT: one-shot pruning with second-order weight updates, layer by layer.

Frantar & Alistarh, "SparseGPT: Massive Language Models Can Be Accurately Pruned in One-Shot", 2023.
1. Layer by layer (outputs of the pruned layer feed the next), collect each linear's Hessian
   H = (2/n) sum X X^T (fp32, the reference's running update).
2. Damp H (0.01 x mean diag), take the upper Cholesky factor of H^-1; visit columns in blocks of 128,
   choosing the mask per 128-column block (lowest w^2 / Hinv_jj^2) or per M columns for N:M from
   the already-updated weights.
3. Zero each pruned weight and move its error onto the columns not yet visited (OBS update, batched
   lazily per block). The math is in `pruning.sparsegpt_solver`.
Select with `pruning=sparsegpt` (conf/pruning/sparsegpt.yaml); layer targets from
`pruning/allocation`.

The defaults are the reference (IST-DASLab/sparsegpt, as run by locuslab/wanda `prune_sparsegpt`):
the adaptive mask per 128 columns (`group: block128`) with its threshold rule, every score <= the
k-th smallest of the block (k + 1 entries and all ties: `ties: reference`), each layer's target as
is (`rounding: floor`), all linears of a layer from one forward pass (`true_sequential: false`), the
next layer fed the pruned outputs. Measured against an independent implementation over all 30
layers of SmolLM2-135M at 50% and 2:4: 0 differing mask entries and pruned weights within 1e-6
(results/benchmarks/faithful_masks.md). Switches: `ties: exact` prunes exactly k per block,
`rounding: carry` keeps the overall sparsity on target under non-uniform allocations (it also
compensates dead inputs' zeros; both together differ from the reference in 2.2% of the entries),
`group: row | matrix` choose one mask up front, `true_sequential: true` prunes q,k,v -> o ->
gate,up -> down with fresh statistics between groups (the IST-DASLab option), `propagate: dense`.
"""

from __future__ import annotations

from typing import Any

import torch

from prunelab.allocation.base import Allocation, allocation_details
from prunelab.allocation.uniform import Uniform
from prunelab.calibration.dense_statistics import DenseStatistics
from prunelab.calibration.passes import layer_pass, role_linears, role_readers
from prunelab.calibration.statistics import Hessian, InputMoments, collect_linear_inputs
from prunelab.context import PruneContext, PruneReport
from prunelab.errors import ConfigError
from prunelab.models import ROLES
from prunelab.pruning.budget import SparsityBudget, check_method_settings
from prunelab.pruning.dsnot import DSnoT, refine_statistics
from prunelab.pruning.masks import parse_sparsity_type
from prunelab.pruning.sparsegpt_solver import check_blocking, inverse_hessian_factor, solve_with_factor


class SparseGPT:
    name = "sparsegpt"

    def __init__(self, sparsity: float = 0.5, sparsity_type: str = "unstructured", group: str = "block128",
                 ties: str = "reference", blocksize: int = 128, percdamp: float = 0.01,
                 true_sequential: bool = False, propagate: str = "pruned", rounding: str = "floor",
                 allocation: Allocation | None = None, refine: DSnoT | None = None):
        self.allocation = allocation or Uniform()
        check_method_settings(sparsity, sparsity_type, group, ties, propagate, rounding, self.allocation, sparsity)
        self.nm = parse_sparsity_type(sparsity_type)
        try:
            check_blocking(blocksize, group, self.nm)
        except ValueError as err:
            raise ConfigError(f"pruning.blocksize: {err}") from None
        if percdamp < 0:
            raise ConfigError(f"pruning.percdamp={percdamp} must be >= 0")
        self.sparsity, self.sparsity_type, self.group, self.ties = sparsity, sparsity_type, group, ties
        self.blocksize, self.percdamp, self.true_sequential = blocksize, percdamp, true_sequential
        self.propagate, self.rounding = propagate, rounding
        self.refine = refine
        if refine is not None:
            refine.check_base(self.name, sparsity_type)

    def labels(self) -> dict[str, Any]:
        labels = {"method": self.name, "sparsity": self.sparsity, "sparsity_type": self.sparsity_type,
                  "allocation": self.allocation.name}
        return {**labels, "refine": self.refine.name} if self.refine else labels

    def allocate(self, ctx: PruneContext) -> list[float]:
        """Per-layer targets from the allocation policy. SparseGPT scores while it prunes (the mask
        depends on the updated weights), layer by layer in `prune`."""
        return self.allocation.allocate(self.sparsity, DenseStatistics(ctx))

    def role_batches(self) -> list[tuple[str, ...]]:
        """Roles whose Hessians are collected in one forward pass, in forward order."""
        return [(role,) for role in ROLES] if self.true_sequential else [tuple(ROLES)]

    @staticmethod
    def layer_state_bytes(out_features: int, in_features: int) -> int:
        """Peak state of one linear's solve: two fp32 [in, in] matrices (the Hessian, factored in
        its own memory, and the factoring's one temporary: `inverse_hessian_factor`), and per
        weight the solver's fp32 copy of W (4 bytes), the mask (1) and the lazy update's product
        (4), with a byte of slack ([out, in])."""
        return 4 * 2 * in_features * in_features + 10 * out_features * in_features

    @torch.no_grad()
    def prune(self, ctx: PruneContext, layer_targets: list[float]) -> PruneReport:
        adapter = ctx.loaded.adapter
        budget = SparsityBudget(self.rounding)
        steps = layer_pass(adapter, ctx.calibration(), ctx.batch_size, self.propagate, ctx.progress,
                           desc="sparsegpt")
        if self.refine:
            self.refine.start()
        for step in steps:
            target = layer_targets[step.index]
            for roles in self.role_batches():
                groups = role_linears(adapter, step.layer, roles)
                with collect_linear_inputs(role_readers(groups), Hessian) as hessians, \
                        refine_statistics(self.refine, groups) as moments:  # one Hessian per role
                    step.forward()
                for role, group in groups.items():
                    # H is factored in its own memory, once for every linear it feeds (q, k, v)
                    factor = inverse_hessian_factor(hessians.pop(role).value, self.percdamp, overwrite=True)
                    for name, linear in group.items():
                        ratio = budget.ratio(target, linear.weight.shape, self.group)
                        pruned, mask = solve_with_factor(linear.weight, factor, ratio, self.nm, self.group,
                                                         self.ties, self.blocksize)
                        if self.refine:
                            pruned = self.refined(f"layers.{step.index}.{name}", role, linear.weight,
                                                  pruned, mask, moments[role])
                        linear.weight.copy_(pruned.to(linear.weight.dtype))  # [out, in]
                        budget.record(target, linear.weight)
                    del factor  # free [in, in] before the next role's solve
        details = {"allocation": allocation_details(self.allocation, layer_targets)}
        if self.refine:
            details["refine"] = self.refine.details()
        return PruneReport(layer_targets=list(layer_targets), details=details)

    def refined(self, key: str, role: str, dense: torch.Tensor, pruned: torch.Tensor, mask: torch.Tensor,
                moments: InputMoments) -> torch.Tensor:
        """SparseGPT's pruned weights ([out, in]) with its mask refined from the dense weights: a
        regrown weight gets its dense value, a newly pruned one is zeroed, the rest keep SparseGPT's
        update."""
        refined = self.refine.refine(key, role, dense, mask, moments)  # [out, in]
        grown = mask & ~refined  # [out, in]
        pruned = torch.where(grown, dense.to(pruned.dtype), pruned)
        return pruned.masked_fill(refined, 0)
