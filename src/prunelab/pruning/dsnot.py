"""DSnoT: training-free prune-and-grow refinement of a given mask, composed after a weight pruner.

Zhang, Zhao, Lin, Sun, Yao, Han, Tanner, Liu & Ji, "Dynamic Sparse No Training: Training-Free
Fine-tuning for Sparse LLMs", ICLR 2024 (zyxxmu/DSnoT, `lib/prune.py` `prune_DSnoT`).
1. Per output row i, the expected reconstruction error of the mask is e_i = sum over pruned j of
   W_ij * mu_j (mu_j: channel j summed over a sample's tokens, averaged over samples).
2. Each cycle, grow the pruned weight that moves e_i most towards 0 (largest / smallest
   W_ij mu_j / var_j ** p, by the sign of e_i) and prune a kept weight of the opposite effect (by sign
   of W_ij mu_j, the one of smallest Wanda score |W_ij| ||X_j||); weights are never updated.
3. A row stops for good once |e_i| <= update_threshold (optionally also when the swap would flip
   the sign of e_i), and every row after `max_cycles`.
Select with `pruning/refine=dsnot` (conf/pruning/refine/dsnot.yaml) after `pruning=wanda`, `ria`,
`sparsegpt` or `magnitude`: the base method chooses its mask in its own layer pass, DSnoT refines
it from statistics of the same forward pass (the layer's inputs after the earlier layers were
pruned and refined), and the refined layer's outputs feed the next layer. The report's details
hold the cycles run and weights swapped per linear and per layer.

The defaults are the reference's README command (`--prune_method DSnoT --initial_method wanda
--sparsity_ratio 0.5 --sparsity_type unstructured --max_cycle_time 50 --update_threshold 0.1
--pow_of_var_regrowing 1`) and main.py's other defaults: `skip: mlp` (its `--skip_layer mlp`: only
the attention linears are refined, the MLP keeps the base mask), no sign test (its
`--without_same_sign` is declared `type=bool` and cannot be turned off), candidates to prune ranked
by the Wanda score whatever the base method. Measured against the official code over all 30
layers of SmolLM2-135M (realtext 32 x 256, seed 0; results/benchmarks/official_dsnot.md):
`pruning=wanda pruning/refine=dsnot` gives the README command's masks, 0 of 106,168,320 entries
differing; the official `--initial_method magnitude` masks by |W| per row, and `pruning=magnitude
group=row ties=exact pruning/refine=dsnot` gives its masks, 0 differing (`refine.skip=none`
differs, so the comparison can fail). An oracle from the paper checks the first layers in CI
(tests/oracles/dsnot.py).

Its `--initial_method sparsegpt` is degenerate (its wrapper never accumulates the Hessian: every
column looks dead, the initial mask is the first half of the columns, weights are not updated;
run on SmolLM2's first two layers, its unrefined MLP zeros are every row's first half and the dense
model's own zeros), so SparseGPT + DSnoT exists only here: DSnoT over prunelab's real SparseGPT,
the refinement computed from the dense weights; a weight it grows gets its dense value back, a
weight it prunes is zeroed, the others keep SparseGPT's update. The reference's N:M loop
(`dsnot_refine_nm_mask`) refines Wanda's and magnitude's N:M masks, its N:M initial methods; other
bases are one line. Unstructured masks with a
varying count per row (magnitude's and RIA's per-matrix threshold, SparseGPT's blocks) are refined
by the same rule, each row over its own kept and pruned weights. Beyond the reference: a row whose
candidate list runs out (fewer kept or pruned weights than cycles; the reference fails on the
index) stops.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from prunelab.calibration.passes import role_readers
from prunelab.calibration.statistics import InputMoments, collect_linear_inputs
from prunelab.errors import ConfigError
from prunelab.pruning.masks import parse_sparsity_type
from prunelab.scoring.weights import wanda_scores

SKIPS = {"none": (), "mlp": ("mlp_in", "mlp_out"), "attention": ("attn_in", "attn_out")}
NM_BASES = ("wanda", "magnitude")  # the reference's N:M loop prunes by these bases' scores


def sign_split_order(values: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Positions of each row's first `lengths` values: the negative ones in position order, then
    the positive ones in reverse position order, a zero value giving position 0 (the reference's
    `return_reorder_indice`, quirk included); 0 beyond a row's length.
    values: [out, n] (0 beyond each row's length); lengths: [out, 1] -> [out, n] (int64)."""
    n = values.shape[1]
    positions = torch.arange(n, device=values.device).expand_as(values)  # [out, n]
    negatives = torch.where(values < 0, positions, n).sort(dim=1).values  # [out, n], n = none
    positives = torch.where(values > 0, positions, n).sort(dim=1).values.flip(1)  # [out, n]
    positives = positives.gather(1, (positions + n - lengths).clamp(max=n - 1))  # ends at lengths
    order = negatives.masked_fill(negatives == n, 0) + positives.masked_fill(positives == n, 0)
    return order.masked_fill(positions >= lengths, 0)


def step_ends(pointers: torch.Tensor, side: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    """Each row's pointer at `side` (0: front, 1: back), then that pointer moved one step inwards.
    pointers, steps: [out, 2]; side: [out, 1] -> [out, 1]."""
    at = pointers.gather(1, side)  # [out, 1]
    pointers.scatter_(1, side, at + steps.gather(1, side))
    return at


@torch.no_grad()
def dsnot_refine_mask(weight: torch.Tensor, mask: torch.Tensor, input_sq_norm: torch.Tensor,
                      input_sum_mean: torch.Tensor, input_variance: torch.Tensor, max_cycles: int = 50,
                      update_threshold: float = 0.1, pow_of_var: float = 1.0, same_sign: bool = False
                      ) -> tuple[torch.Tensor, int, int]:
    """DSnoT's refinement of one linear's mask (True = pruned); returns (mask, cycles, swaps).

    weight, mask: [out, in]; input_sq_norm (Wanda's ||X_j||^2), input_sum_mean (mu_j),
    input_variance (var_j): [in] (`InputMoments`). `cycles` is the number of prune-and-grow cycles
    run, `swaps` the (row, cycle) pairs where a weight was pruned and another grown.
    """
    out_features, in_features = weight.shape
    mask = mask.clone()
    effect = weight.float() * input_sum_mean.reshape(1, -1)  # [out, in] W_ij mu_j
    grow_metric = effect.masked_fill(~mask, 0)  # [out, in] pruned weights' effect, 0 where kept
    error = torch.sum(grow_metric, dim=1, keepdim=True)  # [out, 1] e_i
    initial_sign = torch.sign(error)  # [out, 1]
    if pow_of_var:
        grow_metric /= torch.pow(input_variance.reshape(1, -1), pow_of_var)
    grow_order = torch.sort(grow_metric, dim=1, stable=True)[1]  # [out, in] ascending
    # candidates to prune: the kept weights by ascending Wanda score (pruned ones last, effect 0),
    # then negatives (from the front) and positives (from the back) split by sign of their effect
    wanda = wanda_scores(weight, input_sq_norm).masked_fill(mask, float("inf"))  # [out, in]
    kept_order = torch.sort(wanda, dim=1, stable=True)[1]  # [out, in], kept ones first
    kept = (~mask).sum(dim=1, keepdim=True)  # [out, 1]
    kept_effect = effect.gather(1, kept_order).masked_fill(mask.gather(1, kept_order), 0)  # [out, in]
    prune_order = kept_order.gather(1, sign_split_order(kept_effect, kept))  # [out, in]

    steps = torch.tensor([[1, -1]], device=weight.device).expand(out_features, 2)  # [out, 2]
    grow_pointers = torch.tensor([[0, in_features - 1]], device=weight.device).repeat(out_features, 1)
    prune_pointers = torch.cat([torch.zeros_like(kept), kept - 1], dim=1)  # [out, 2]
    active = torch.ones_like(error, dtype=torch.bool)  # [out, 1]
    cycles = swaps = 0
    while bool(active.any()) and cycles < max_cycles:
        cycles += 1
        grow_at = step_ends(grow_pointers, (error > 0).long(), steps)  # [out, 1]
        prune_at = step_ends(prune_pointers, (error < 0).long(), steps)  # [out, 1]
        # a candidate list run out (narrow rows): the reference fails on the index; the row stops
        exhausted = ((grow_at < 0) | (grow_at >= in_features)
                     | (prune_at < 0) | (prune_at >= kept))  # [out, 1]
        grow = grow_order.gather(1, grow_at.clamp(0, in_features - 1))  # [out, 1]
        prune = prune_order.gather(1, prune_at.clamp(0, in_features - 1))  # [out, 1]
        grow_effect, prune_effect = effect.gather(1, grow), effect.gather(1, prune)  # [out, 1]
        after = error + prune_effect - grow_effect  # [out, 1]
        active = active & (torch.abs(error) > update_threshold)
        if same_sign:
            active = active & (initial_sign == torch.sign(after))
        active = active & ~exhausted
        swaps += apply_swaps(mask, error, prune, grow, prune_effect, grow_effect, active, exhausted)
    return mask, cycles, swaps


def apply_swaps(mask: torch.Tensor, error: torch.Tensor, prune: torch.Tensor, grow: torch.Tensor,
                prune_effect: torch.Tensor, grow_effect: torch.Tensor, active: torch.Tensor,
                exhausted: torch.Tensor) -> int:
    """One cycle's writes, in place: each active row prunes `prune` and grows `grow` (their effects
    moving its error e_i); a stopped row re-prunes its grow candidate (the reference writes "no
    update" into both); a row whose candidates ran out is left alone. All [out, 1]; returns the swaps."""
    mask.scatter_(1, prune, torch.where(exhausted, mask.gather(1, prune), active))
    mask.scatter_(1, grow, torch.where(exhausted, mask.gather(1, grow), ~active))
    error += torch.where(active, prune_effect, torch.zeros_like(prune_effect))
    error -= torch.where(active, grow_effect, torch.zeros_like(grow_effect))
    return int(active.sum())


def sorted_nm_mask(score: torch.Tensor, n: int, m: int) -> torch.Tensor:
    """The N:M mask (True = pruned) the reference's DSnoT starts its N:M loop from: per block of M
    columns, the first N of `torch.sort` (not `topk`, as the base methods choose it: with tied scores
    the two can keep different weights). score: [out, in] -> [out, in]."""
    mask = torch.zeros_like(score, dtype=torch.bool)
    for start in range(0, score.shape[1], m):
        order = torch.sort(score[:, start:start + m], dim=1)[1] + start  # [out, M]
        mask.scatter_(1, order[:, :n], True)
    return mask


@torch.no_grad()
def dsnot_refine_nm_mask(weight: torch.Tensor, mask: torch.Tensor, prune_metric: torch.Tensor,
                         input_sum_mean: torch.Tensor, input_variance: torch.Tensor, m: int,
                         max_cycles: int = 50, update_threshold: float = 0.1, pow_of_var: float = 1.0
                         ) -> tuple[torch.Tensor, int, int]:
    """DSnoT's N:M refinement of one linear's mask (True = pruned); returns (mask, cycles, swaps).

    The reference's N:M loop (`prune_DSnoT`, `prune_n != 0`): the weight to grow is chosen as in the
    unstructured loop (from the front or back of the pruned weights ordered by W_ij mu_j / var_j ** p,
    by the sign of e_i), the weight to prune is the kept one of lowest `prune_metric` (the base
    method's score: Wanda's |W| ||X||, or |W|) in the grown weight's own group of M inputs, so every
    group keeps its N:M count. Unlike the unstructured loop, a row also stops when the swap would flip
    the sign of e_i (the sign test is not a switch here). As in the reference, every cycle moves the
    row's grow pointer and retires its prune candidate (score set to +inf), swapped or not.
    weight, mask, prune_metric: [out, in]; input_sum_mean, input_variance: [in].
    """
    in_features = weight.shape[1]
    mask = mask.clone()
    effect = weight.float() * input_sum_mean.reshape(1, -1)  # [out, in] W_ij mu_j
    grow_metric = effect.masked_fill(~mask, 0)  # [out, in]
    error = torch.sum(grow_metric, dim=1, keepdim=True)  # [out, 1]
    initial_sign = torch.sign(error)  # [out, 1]
    if pow_of_var:
        grow_metric /= torch.pow(input_variance.reshape(1, -1), pow_of_var)
    grow_order = torch.sort(grow_metric, dim=1, stable=True)[1]  # [out, in] ascending
    score = prune_metric.float().masked_fill(mask, float("inf"))  # [out, in] pruned ones never chosen
    retired = score.max(dim=1, keepdim=True)[0] + 1  # [out, 1] (+inf as soon as a row has a pruned weight)
    steps = torch.tensor([[1, -1]], device=weight.device).expand(weight.shape[0], 2)  # [out, 2]
    grow_pointers = torch.tensor([[0, in_features - 1]], device=weight.device).repeat(weight.shape[0], 1)
    offsets = torch.arange(m, device=weight.device).reshape(1, -1)  # [1, M]
    active = torch.ones_like(error, dtype=torch.bool)  # [out, 1]
    cycles = swaps = 0
    while bool(active.any()) and cycles < max_cycles:
        cycles += 1
        grow_at = step_ends(grow_pointers, (error > 0).long(), steps)  # [out, 1]
        exhausted = (grow_at < 0) | (grow_at >= in_features)  # a narrow row's list ran out: it stops
        grow = grow_order.gather(1, grow_at.clamp(0, in_features - 1))  # [out, 1]
        grow_effect = effect.gather(1, grow)  # [out, 1]
        start = grow - grow % m  # [out, 1] the grown weight's group
        group = offsets + start  # [out, M]
        prune = score.gather(1, group).topk(1, dim=1, largest=False)[1] + start  # [out, 1]
        prune_effect = effect.gather(1, prune)  # [out, 1]
        after = error + prune_effect - grow_effect  # [out, 1]
        active = active & (initial_sign == torch.sign(after)) & (torch.abs(error) > update_threshold)
        active = active & ~exhausted
        score.scatter_(1, prune, torch.where(exhausted, score.gather(1, prune), retired))
        swaps += apply_swaps(mask, error, prune, grow, prune_effect, grow_effect, active, exhausted)
    return mask, cycles, swaps


class DSnoT:
    """The refinement step a weight-pruning method runs on each linear's mask (module doc)."""

    name = "dsnot"

    def __init__(self, max_cycles: int = 50, update_threshold: float = 0.1, pow_of_var: float = 1.0,
                 same_sign: bool = False, skip: str = "mlp"):
        if isinstance(max_cycles, bool) or not isinstance(max_cycles, int) or max_cycles < 1:
            raise ConfigError(f"pruning.refine.max_cycles={max_cycles!r} must be a whole number >= 1")
        if isinstance(update_threshold, bool) or not isinstance(update_threshold, (int, float)) \
                or update_threshold < 0:
            raise ConfigError(f"pruning.refine.update_threshold={update_threshold!r} must be a number "
                              ">= 0")
        if isinstance(pow_of_var, bool) or not isinstance(pow_of_var, (int, float)):
            raise ConfigError(f"pruning.refine.pow_of_var={pow_of_var!r} must be a number")
        if skip not in SKIPS:
            raise ConfigError(f"pruning.refine.skip={skip!r} is not one of {', '.join(SKIPS)}")
        self.max_cycles, self.update_threshold = max_cycles, float(update_threshold)
        self.pow_of_var, self.same_sign, self.skip = float(pow_of_var), bool(same_sign), skip
        self.work: dict[str, dict[str, int]] = {}

    def start(self) -> None:
        """Forget the work of an earlier run (a method object may prune more than once)."""
        self.work = {}

    def check_base(self, method: str, sparsity_type: str) -> None:
        """One line for a base the refinement cannot follow; N:M remembers the base's score (the
        reference's N:M loop prunes by it) and the group size."""
        self.nm = parse_sparsity_type(sparsity_type)
        self.base = method
        if self.nm is not None and method not in NM_BASES:
            raise ConfigError(f"pruning/refine=dsnot refines {sparsity_type} masks of {' or '.join(NM_BASES)} "
                              f"(the reference's N:M initial methods), not of {method}")

    def statistic(self, in_features: int, device: torch.device | None = None) -> InputMoments:
        return InputMoments(in_features, device)

    def refine(self, key: str, role: str, weight: torch.Tensor, mask: torch.Tensor,
               moments: InputMoments) -> torch.Tensor:
        """The refined mask of linear `key` ("layers.i.name"; `role` decides whether it is skipped),
        its cycles and swaps kept for the report."""
        if role in SKIPS[self.skip]:
            return mask
        if getattr(self, "nm", None) is not None:  # the base's own score picks the weight to prune
            score = wanda_scores(weight, moments.sq_norm) if self.base == "wanda" else weight.abs()
            mask = sorted_nm_mask(score, *self.nm)  # the reference re-chooses it: its ties may fall otherwise
            refined, cycles, swaps = dsnot_refine_nm_mask(
                weight, mask, score, moments.sum_mean, moments.variance, self.nm[1], self.max_cycles,
                self.update_threshold, self.pow_of_var)
        else:
            refined, cycles, swaps = dsnot_refine_mask(
                weight, mask, moments.sq_norm, moments.sum_mean, moments.variance, self.max_cycles,
                self.update_threshold, self.pow_of_var, self.same_sign)
        self.work[key] = {"cycles": cycles, "swaps": swaps}
        return refined

    def details(self) -> dict[str, Any]:
        """Settings and work for the PruneReport: cycles and swaps per linear and per layer."""
        per_layer: dict[int, dict[str, int]] = {}
        for key, work in self.work.items():
            layer = per_layer.setdefault(int(key.split(".")[1]), {"cycles": 0, "swaps": 0})
            layer["cycles"] = max(layer["cycles"], work["cycles"])
            layer["swaps"] += work["swaps"]
        return {"name": self.name, "max_cycles": self.max_cycles,
                "update_threshold": self.update_threshold,
                "pow_of_var": self.pow_of_var, "same_sign": self.same_sign, "skip": self.skip,
                "per_linear": dict(self.work), "per_layer": per_layer,
                "swaps": sum(work["swaps"] for work in self.work.values())}


@contextmanager
def refine_statistics(refine: DSnoT | None, groups: dict[str, dict[str, nn.Linear]]
                      ) -> Iterator[dict[str, InputMoments]]:
    """The refinement's input statistics per role for the forward pass inside the block (none
    without a refinement); the base method's own hooks run beside them."""
    if refine is None:
        yield {}
        return
    with collect_linear_inputs(role_readers(groups), refine.statistic) as moments:
        yield moments
