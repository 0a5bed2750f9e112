"""Wanda: pruning by weight magnitude times input activation norm.

Sun, Liu, Bair & Kolter, "A Simple and Effective Pruning Approach for Large Language Models", 2023.
1. Layer by layer (calibration outputs of the pruned layer feed the next), collect ||X_j||^2, the
   running mean over samples of the squared L2 norm of input channel j over tokens.
2. Score S_ij = |W_ij| * ||X_j||_2.
3. Prune the lowest s of each output row (`group: row`, the reference's comparison group;
   `matrix` / `block128` switch it), or the n lowest of every m consecutive inputs ("2:4", "4:8").
Select with `pruning=wanda` (conf/pruning/wanda.yaml); layer-wise targets from `pruning/allocation`.

Variant (`use_variant: true`, the paper's appendix): per row, prune the smallest scores whose
cumulative sum stays below alpha x the row's total; alpha is shared by the matrix and found by
binary search (start 0.4, bracket [0, 0.8], stop when the matrix is within 0.001 of s or the
bracket is narrower than 0.001), every score <= the row threshold is pruned (ties included).
Reference quirk not reproduced: a row where no cumulative sum fits gathers index -1 (its largest
score) and is pruned entirely; here such a row keeps every weight.

The defaults are the reference (locuslab/wanda `prune_wanda`): exactly k = floor(s x in) of every
row (`ties: exact`, stable sort), each layer's target as is (`rounding: floor`), the input norms in
the repository's arithmetic (`norm_arithmetic: reference`, a running mean of
torch.norm(X, dim=1) ** 2), the next layer fed the pruned outputs (`propagate: pruned`). Measured
against an independent implementation of the paper over all 30 layers of SmolLM2-135M at 50% and
2:4: 0 differing mask entries (results/benchmarks/faithful_masks.md). Switches: `norm_arithmetic:
sum_of_squares` (equal in exact arithmetic; flips 1,232 near-tied entries on SmolLM2-135M),
`ties: reference` (every score <= the k-th smallest: one extra zero per row, not the Wanda
reference), `rounding: carry` (keeps the overall sparsity on target under non-uniform allocations),
`propagate: dense`.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch

from prunelab.allocation.base import Allocation, allocation_details
from prunelab.allocation.uniform import Uniform
from prunelab.calibration.dense_statistics import DenseStatistics
from prunelab.calibration.passes import layer_pass, role_linears, role_readers
from prunelab.calibration.statistics import NORM_ARITHMETIC, SquaredColumnNorm, collect_linear_inputs
from prunelab.context import PruneContext, PruneReport
from prunelab.errors import ConfigError
from prunelab.pruning.budget import SparsityBudget, check_method_settings
from prunelab.pruning.dsnot import DSnoT, refine_statistics
from prunelab.pruning.masks import apply_mask, make_mask, parse_sparsity_type
from prunelab.scoring.weights import wanda_scores

def variant_mask_at(alpha: float, sorted_scores: torch.Tensor, cumulative: torch.Tensor,
                    row_sums: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    """Mask of the scores <= each row's threshold, the largest sorted score whose cumulative sum
    is <= alpha x the row's sum. sorted_scores, cumulative, scores: [out, in]; row_sums: [out]."""
    fits = cumulative <= (row_sums * alpha).unsqueeze(1)  # [out, in]
    count = fits.sum(dim=1, keepdim=True)  # [out, 1]
    threshold = torch.gather(sorted_scores, 1, (count - 1).clamp_min(0))  # [out, 1]
    threshold = torch.where(count > 0, threshold, torch.full_like(threshold, -float("inf")))
    return scores <= threshold  # [out, in]


def wanda_variant_mask(scores: torch.Tensor, sparsity: float, start: float = 0.4,
                       bracket: tuple[float, float] = (0.0, 0.8), tolerance: float = 0.001
                       ) -> tuple[torch.Tensor, float]:
    """The appendix variant's mask and the alpha it settled on. scores: [out, in]."""
    sorted_scores = torch.sort(scores, dim=-1, stable=True).values  # [out, in]
    cumulative = torch.cumsum(sorted_scores, dim=1)  # [out, in]
    row_sums = scores.sum(dim=1)  # [out]
    alpha, (low, high) = start, bracket
    mask = variant_mask_at(alpha, sorted_scores, cumulative, row_sums, scores)
    current = mask.float().mean().item()
    while abs(current - sparsity) > tolerance and high - low >= tolerance:
        if current > sparsity:
            alpha, high = (alpha + low) / 2.0, alpha
        else:
            alpha, low = (alpha + high) / 2.0, alpha
        mask = variant_mask_at(alpha, sorted_scores, cumulative, row_sums, scores)
        current = mask.float().mean().item()
    return mask, alpha


class Wanda:
    name = "wanda"

    def __init__(self, sparsity: float = 0.5, sparsity_type: str = "unstructured", group: str = "row",
                 ties: str = "exact", use_variant: bool = False, propagate: str = "pruned",
                 rounding: str = "floor", norm_arithmetic: str = "reference",
                 allocation: Allocation | None = None, refine: DSnoT | None = None):
        self.allocation = allocation or Uniform()
        check_method_settings(sparsity, sparsity_type, group, ties, propagate, rounding, self.allocation, sparsity)
        if use_variant and parse_sparsity_type(sparsity_type):
            raise ConfigError("pruning.use_variant is an unstructured rule: use sparsity_type=unstructured")
        if norm_arithmetic not in NORM_ARITHMETIC:
            raise ConfigError(f"pruning.norm_arithmetic={norm_arithmetic!r} is not one of "
                              f"{', '.join(NORM_ARITHMETIC)}")
        self.sparsity, self.sparsity_type, self.group, self.ties = sparsity, sparsity_type, group, ties
        self.use_variant, self.propagate, self.rounding = use_variant, propagate, rounding
        self.norm_arithmetic = norm_arithmetic
        self.refine = refine
        if refine is not None:
            refine.check_base(self.name, sparsity_type)

    def labels(self) -> dict[str, Any]:
        labels = {"method": "wanda_variant" if self.use_variant else self.name, "sparsity": self.sparsity,
                  "sparsity_type": self.sparsity_type, "allocation": self.allocation.name}
        return {**labels, "refine": self.refine.name} if self.refine else labels

    def allocate(self, ctx: PruneContext) -> list[float]:
        """Per-layer targets from the allocation policy. Wanda's scores depend on the already-pruned
        earlier layers, so they are computed layer by layer in `prune`."""
        return self.allocation.allocate(self.sparsity, DenseStatistics(ctx))

    def scores(self, weight: torch.Tensor, input_sq_norm: torch.Tensor) -> torch.Tensor:
        """One linear's [out, in] scores from its [in] input statistic."""
        return wanda_scores(weight, input_sq_norm)

    def mask(self, scores: torch.Tensor, ratio: float, role: str) -> tuple[torch.Tensor, float | None]:
        """(mask, alpha of the variant or None) for one linear's [out, in] scores (`role`: attn_in,
        attn_out, mlp_in or mlp_out)."""
        if self.use_variant:
            return wanda_variant_mask(scores, ratio)
        return make_mask(scores, ratio, self.sparsity_type, self.group, self.ties), None

    @torch.no_grad()
    def prune(self, ctx: PruneContext, layer_targets: list[float]) -> PruneReport:
        adapter = ctx.loaded.adapter
        budget = SparsityBudget(self.rounding)
        alphas: dict[str, float] = {}
        statistic = partial(SquaredColumnNorm, arithmetic=self.norm_arithmetic)
        steps = layer_pass(adapter, ctx.calibration(), ctx.batch_size, self.propagate, ctx.progress,
                           desc=self.name)
        if self.refine:
            self.refine.start()
        for step in steps:
            target = layer_targets[step.index]
            groups = role_linears(adapter, step.layer)
            with collect_linear_inputs(role_readers(groups), statistic) as norms, \
                    refine_statistics(self.refine, groups) as moments:
                step.forward()
            for role, group in groups.items():
                for name, linear in group.items():
                    scores = self.scores(linear.weight, norms[role].value)  # [out, in]
                    ratio = budget.ratio(target, scores.shape, None if self.use_variant else self.group)
                    mask, alpha = self.mask(scores, ratio, role)
                    if self.refine:
                        mask = self.refine.refine(f"layers.{step.index}.{name}", role, linear.weight, mask,
                                                  moments[role])
                    apply_mask(linear.weight, mask)
                    budget.record(target, linear.weight)
                    if alpha is not None:
                        alphas[f"layers.{step.index}.{name}"] = alpha
        details: dict[str, Any] = {"allocation": allocation_details(self.allocation, layer_targets)}
        if alphas:
            details["variant_alpha"] = alphas
        if self.refine:
            details["refine"] = self.refine.details()
        return PruneReport(layer_targets=list(layer_targets), details=details)
