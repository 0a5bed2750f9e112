"""Oracle for RIA: relative importance and activations.

Zhang, Bai, Lin, Zhao, Hou & Cannistraci, "Plug-and-Play: An Efficient Post-training Pruning Method
for Large Language Models", ICLR 2024 (biomedical-cybernetics/Relative-importance-and-activation-
pruning, `prune_ria`). Layer by layer, the pruned outputs of each layer feeding the next:
1. Wanda's statistic: the running mean over samples of torch.norm(X, p=2, dim=1) ** 2 (`oracles.wanda`);
2. relative importance RI_ij = |W_ij| / (sum over the column j of |W|) + |W_ij| / (sum over the
   row i of |W|), the metric RI * sqrt(s) ** a (a = 0.5);
3. unstructured: one threshold per matrix, the metric at 0-based position int(numel * s) of the
   sorted flattened metrics, every metric <= it pruned; N:M: the n lowest of every m columns;
4. N:M with channel reallocation (section 3.2, the heuristic): order the columns by their summed
   metric (ascending), cut that order into m equal bands, fill position b of every group of m from
   band b (every second band read backwards), take the n lowest of each group in that order, and
   put the mask back in the original column order.
For testing prunelab's `pruning=ria` against the protocol; imports nothing from prunelab.
"""

from __future__ import annotations

import torch
from torch import nn

from oracles.llama_layers import layer_by_layer
from oracles.magnitude import n_of_m_mask, threshold_mask
from oracles.wanda import RunningSquaredNorm


def relative_importance_metric(weight: torch.Tensor, scaler: torch.Tensor, a: float = 0.5) -> torch.Tensor:
    """RI * sqrt(scaler) ** a for weight [out, in] and scaler [in]."""
    w = torch.abs(weight)
    column_totals = torch.sum(w, dim=0)  # [in]
    row_totals = torch.sum(w, dim=1).reshape(-1, 1)  # [out, 1]
    return (w / column_totals + w / row_totals) * torch.sqrt(scaler.reshape((1, -1))) ** a


def reallocated_columns(metric: torch.Tensor, m: int) -> torch.Tensor:
    """The column order of the heuristic channel reallocation."""
    columns = metric.shape[1]
    ascending = torch.sort(torch.sum(metric, dim=0))[1]
    order = torch.empty_like(ascending)
    for band in range(m):
        members = ascending[int(columns * band / m):int(columns * (band + 1) / m)]
        if band % 2 == 1:
            members = members.flip(0)
        order[band::m] = members
    return order


@torch.no_grad()
def ria_oracle(model: nn.Module, token_ids: torch.Tensor, sparsity: float = 0.5,
               nm: tuple[int, int] | None = None, a: float = 0.5, reallocation: bool = False) -> None:
    """Prune `model` (a Hugging Face Llama) in place with calibration `token_ids` [N, T]."""

    def make_observer(linears):
        stats = {name: RunningSquaredNorm(linear.in_features) for name, linear in linears.items()}
        return (lambda name, x: stats[name].add(x)), stats

    def prune_layer(linears, stats):
        for name, linear in linears.items():
            weight = linear.weight.data
            metric = relative_importance_metric(weight.float(), stats[name].scaler, a)  # [out, in]
            if nm and reallocation:
                order = reallocated_columns(metric, nm[1])
                mask = torch.zeros_like(metric, dtype=torch.bool)
                mask[:, order] = n_of_m_mask(metric[:, order], *nm)
            elif nm:
                mask = n_of_m_mask(metric, *nm)
            else:
                mask = threshold_mask(metric, sparsity)
            weight[mask] = 0

    layer_by_layer(model, token_ids, make_observer, prune_layer)
