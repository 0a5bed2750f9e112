"""Width-pruning scores and selections: pure functions on tensors (FLAP, Wanda-sp, magnitude-sp).

An attention unit is a key/value head with its query heads (one head on a multi-head model): its
`unit_width` = query heads per group x head_dim consecutive input columns of o_proj. An MLP unit
is one input column of down_proj. Scores are per input column of the residual-writing linear
(o_proj, down_proj) and summed or averaged per unit as each reference does. The arithmetic
follows the FLAP repository (`lib/prune.py`) operation for operation, so that the same inputs give
the same bits.
"""

from __future__ import annotations

import torch

FLAP_METRICS = ("WIFV", "IFV", "WIFN")
REFERENCE_HEAD_COST = 512.0 / 3  # FLAP's cost of a head in MLP-channel units, stored in int64: 170


def flap_metric(metric: str, statistic: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """FLAP's per-input-column importance (An et al. 2024, eq. 5 and its ablations).

    Args:
        statistic: [in] the fluctuation (IFV, WIFV) or mean squared norm (WIFN) of each input
            column (`calibration.statistics.BaselineFluctuation`).
        weight: [out, in] the linear reading those columns (o_proj or down_proj).
    Returns [in] float32: WIFV = fluctuation x ||W_:,j||^2; IFV = fluctuation;
    WIFN = mean over rows of |W_ij| sqrt(norm_j).
    """
    if metric == "IFV":
        return statistic
    if metric == "WIFV":
        return statistic * torch.sum(weight.data.pow(2), dim=0)  # [in]
    if metric == "WIFN":
        return (torch.abs(weight.data) * torch.sqrt(statistic.reshape((1, -1)))).mean(axis=0)  # [in]
    raise ValueError(f"metric {metric!r} is not one of {FLAP_METRICS}")


def standardize(x: torch.Tensor) -> torch.Tensor:
    """Per row (layer): (x - mean) / std, the unbiased std as the reference. x: [L, n] -> [L, n]."""
    return (x - torch.mean(x, axis=1, keepdim=True)) / torch.std(x, axis=1, keepdim=True)


def adaptive_unit_scores(attn_metric: torch.Tensor, mlp_metric: torch.Tensor, unit_width: int
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """FLAP's AL-AM scores, comparable across layers and modules: each layer's column metrics
    standardised, then averaged per attention unit.
    attn_metric: [L, H * head_dim]; mlp_metric: [L, M] -> ([L, G], [L, M])."""
    layers = attn_metric.shape[0]
    attn = standardize(attn_metric).reshape(layers, -1, unit_width).mean(dim=2)  # [L, G]
    return attn, standardize(mlp_metric)  # [L, G], [L, M]


def adaptive_keep(attn_scores: torch.Tensor, mlp_scores: torch.Tensor, attn_cost: torch.Tensor | float,
                  mlp_cost: torch.Tensor | float, kept_cost: torch.Tensor | None = None,
                  ratio: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """FLAP's global selection (AL-AM): every unit of every layer in one descending order of
    score, cut where the cumulative cost of the kept units is nearest to the cost to keep; a unit
    is kept if its score is above the score at the cut.

    attn_scores: [L, G], mlp_scores: [L, M]; attn_cost, mlp_cost: the cost of one unit (the
    reference: int64 170 and 1); the cost to keep is `kept_cost`, or (the reference) the total
    cost x (1 - ratio). Returns the keep masks ([L, G], [L, M] bool).

    The reference keeps the scores strictly above the cut's, so the unit at the cut (counted as
    kept when the cut was chosen) goes too. With `kept_cost` (a parameter budget) the units up to
    and including the cut are kept, so the kept cost is the one chosen.
    """
    scores = torch.cat([attn_scores.view(-1), mlp_scores.view(-1)])  # [L*G + L*M]
    sorted_scores, indices = torch.sort(scores, descending=True)
    dtype = torch.int64 if not torch.is_tensor(attn_cost) else attn_cost.dtype
    costs = torch.ones_like(indices, dtype=dtype) * mlp_cost  # [units] in sorted order
    costs[indices < attn_scores.numel()] = attn_cost
    cumulative = torch.cumsum(costs, 0)  # [units]
    if kept_cost is not None:  # a parameter budget: the units up to the cut
        cut = int(torch.argmin(torch.abs(cumulative - kept_cost)))
        keep = torch.zeros_like(scores, dtype=torch.bool)  # [units]
        keep[indices[: cut + 1]] = True
        return keep[: attn_scores.numel()].view_as(attn_scores), keep[attn_scores.numel():].view_as(mlp_scores)
    cut = torch.argmin(torch.abs(cumulative - torch.sum(costs) * (1 - ratio)))  # int64 total x float
    threshold = sorted_scores[cut]
    return attn_scores > threshold, mlp_scores > threshold


def uniform_keep(scores: torch.Tensor, num_remove: int) -> torch.Tensor:
    """The reference's per-layer rule (Wanda-sp, magnitude-sp, FLAP's UL-UM): keep every unit
    scoring at least the `num_remove`-th smallest score (ties at it are kept). scores: [n] -> [n] bool."""
    threshold = torch.sort(scores)[0][num_remove]
    return scores >= threshold


def per_unit(column_scores: torch.Tensor, unit_width: int, reduce: str = "sum") -> torch.Tensor:
    """[G * unit_width] column scores -> [G] attention-unit scores (sum: Wanda-sp, magnitude-sp,
    FLAP's UL-UM)."""
    grouped = column_scores.reshape(-1, unit_width)  # [G, unit_width]
    return grouped.sum(dim=1) if reduce == "sum" else grouped.mean(dim=1)


def wanda_sp_column_scores(wanda_scores: torch.Tensor) -> torch.Tensor:
    """Wanda-sp (An et al. 2024's baseline): the mean over output rows of Wanda's |W_ij| ||X_j||,
    one score per input column. wanda_scores: [out, in] -> [in]."""
    return wanda_scores.mean(axis=0)


def magnitude_sp_column_scores(weight: torch.Tensor) -> torch.Tensor:
    """Magnitude-sp: the L2 norm of each input column, in the weight's dtype as the reference.
    weight: [out, in] -> [in]."""
    return torch.norm(weight.data, dim=0)


def compensation_bias(baseline: torch.Tensor, keep_columns: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """FLAP's bias: the removed columns' mean input times their weights, so that the layer's
    output keeps its mean (An et al. 2024, eq. 7). baseline: [in] (already in the reference's
    float16 when that is the setting); keep_columns: [in] bool; weight: [out, in] -> [out]."""
    removed = baseline * ~keep_columns.to(baseline.device)  # [in]
    return removed.to(weight.dtype) @ weight.data.T  # [out]


# --- LLM-Pruner (Ma, Fang & Wang, NeurIPS 2023): group importance of heads and channels --------
TAYLOR_ORDERS = ("param_first", "vectorize", "param_second", "param_mix")
GROUP_REDUCTIONS = ("sum", "mean", "max", "prod", "first")


def taylor_salience(weight: torch.Tensor, grad: torch.Tensor | None, squared_grad: torch.Tensor | None,
                    taylor: str) -> torch.Tensor:
    """LLM-Pruner's per-weight salience (eq. 4-5 of the paper, the repository's `TaylorImportance`).

    weight, grad: [out, in]; grad is dL/dW of the mean calibration loss; squared_grad: [out, in]
    the mean over single-sequence backward passes of (dL_j/dW)^2 (the Fisher diagonal, the
    repository's `acc_grad`), needed by param_second and param_mix only.
    param_first, vectorize: W * g; param_second: W * F * W; param_mix: W * g - 0.5 * W * F * W.
    """
    if taylor == "param_second":
        return weight * squared_grad * weight
    first = weight * grad
    if taylor == "param_mix":
        return first - 0.5 * weight * squared_grad * weight
    return first


def channel_importance(salience: torch.Tensor, dim: int, taylor: str) -> torch.Tensor:
    """One score per channel of a linear from its salience [out, in]: over the input columns
    (dim=1: an output row, e.g. a row of q_proj) or over the output rows (dim=0: an input column,
    e.g. a column of o_proj). vectorize: |sum|; the param_* orders: sum of |.|."""
    if taylor == "vectorize":
        return salience.sum(dim).abs()
    return salience.abs().sum(dim)


def magnitude_importance(weight: torch.Tensor, dim: int, p: int) -> torch.Tensor:
    """LLM-Pruner's l1 / l2 importance of each channel: sum |W|^p over the other dimension (no
    root). weight: [out, in] -> [out] (dim=1) or [in] (dim=0)."""
    return weight.abs().pow(p).sum(dim)


def reduce_group(importances: list[torch.Tensor], reduction: str) -> torch.Tensor:
    """The group's importance of each channel from its members' ([modules] x [n], the members in
    the reference's order, its root first): the repository's `_reduce` over the stacked members."""
    stacked = torch.stack(importances, dim=0)  # [modules, n]
    if reduction == "sum":
        return stacked.sum(dim=0)
    if reduction == "mean":
        return stacked.mean(dim=0)
    if reduction == "max":
        return stacked.max(dim=0)[0]
    if reduction == "prod":
        return torch.prod(stacked, dim=0)
    if reduction == "first":
        return stacked[0]
    raise ValueError(f"reduction {reduction!r} is not one of {GROUP_REDUCTIONS}")


def fold_query_heads(channel_scores: torch.Tensor, num_kv_heads: int, head_dim: int) -> torch.Tensor:
    """A query-side module's channel scores ([H * head_dim]: q_proj rows or o_proj columns) summed
    over the query heads of each key/value group, position by position: [G * head_dim]. The
    identity on a multi-head model (one query head per group)."""
    return channel_scores.reshape(num_kv_heads, -1, head_dim).sum(dim=1).reshape(-1)  # [G * head_dim]


def consecutive_sum(scores: torch.Tensor, width: int) -> torch.Tensor:
    """[n * width] channel scores -> [n] unit scores: sums of `width` consecutive channels (the
    reference's `consecutive_groups`, head_dim for attention)."""
    return scores.view(-1, width).sum(1)


def lowest(scores: torch.Tensor, count: int) -> torch.Tensor:
    """Indices of the `count` lowest scores, the reference's unstable `argsort` (ties as torch
    orders them). scores: [n] -> [count]."""
    return torch.argsort(scores)[:count]


def reference_pruned_channels(channels: int, ratio: float) -> int:
    """Channels the reference removes from a module of `channels` outputs at `ratio`:
    channels - int(channels x (1 - ratio)) (torch_pruning's MetaPruner, one step)."""
    return channels - int(channels * (1 - ratio))
