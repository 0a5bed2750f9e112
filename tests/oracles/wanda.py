"""Oracle for Wanda: pruning by weights and activations.

Sun, Liu, Bair & Kolter, "A Simple and Effective Pruning Approach for Large Language Models", 2023
(locuslab/wanda, `prune_wanda`). Layer by layer, with the pruned outputs of each layer feeding the
next:
1. every linear's input X (as [in, tokens], float32, one calibration sample per forward) updates a
   running mean over samples of torch.norm(X, p=2, dim=1) ** 2: after n samples, a batch of b
   samples does  s *= n / (n + b);  n += b;  s += torch.norm(X, p=2, dim=1) ** 2 / n;
2. score S = |W| * sqrt(s) (s broadcast over the output rows);
3. per output row prune exactly k = int(in * sparsity) lowest scores (stable sort: ties go to the
   lower column); N:M: for every m-column group, the n lowest of that group's [out, m] slice.
All linears of a layer are scored from one statistics pass, then pruned; the samples are then run
again through the pruned layer.

`norm="sum_of_squares"` accumulates (x * x) summed over tokens instead of the squared norm: equal
in exact arithmetic, kept to show what the reference's arithmetic changes.
For testing prunelab's `pruning=wanda` against the protocol; imports nothing from prunelab.
"""

from __future__ import annotations

import torch
from torch import nn

from oracles.llama_layers import layer_by_layer


class RunningSquaredNorm:
    """Wanda's `scaler_row` for one linear: the running mean of ||X_j||^2 over samples."""

    def __init__(self, columns: int, norm: str = "reference"):
        self.scaler = torch.zeros(columns, dtype=torch.float32)  # [in]
        self.samples = 0
        self.norm = norm

    def add(self, inp: torch.Tensor) -> None:
        """inp: the linear's input for one forward, [b, tokens, in] (or [tokens, in] for b = 1)."""
        if inp.dim() == 2:
            inp = inp.unsqueeze(0)
        batch = inp.shape[0]
        x = inp.reshape(-1, inp.shape[-1]).t().float()  # [in, tokens]
        self.scaler *= self.samples / (self.samples + batch)
        self.samples += batch
        if self.norm == "reference":
            self.scaler += torch.norm(x, p=2, dim=1) ** 2 / self.samples
        else:
            self.scaler += (x * x).sum(dim=1) / self.samples


def row_mask(metric: torch.Tensor, sparsity: float) -> torch.Tensor:
    """True where pruned: the int(in * s) lowest of each row, by stable sort."""
    mask = torch.zeros_like(metric, dtype=torch.bool)
    k = int(metric.shape[1] * sparsity)
    order = torch.sort(metric, dim=-1, stable=True)[1]  # [out, in]
    mask.scatter_(1, order[:, :k], True)
    return mask


def n_of_m_mask(metric: torch.Tensor, n: int, m: int) -> torch.Tensor:
    """True where pruned: for each m-column group, the n lowest of its [out, m] slice."""
    mask = torch.zeros_like(metric, dtype=torch.bool)
    for start in range(0, metric.shape[1], m):
        group = metric[:, start : start + m].float()  # [out, m]
        mask.scatter_(1, start + torch.topk(group, n, dim=1, largest=False)[1], True)
    return mask


@torch.no_grad()
def wanda_oracle(model: nn.Module, token_ids: torch.Tensor, sparsity: float = 0.5,
                 nm: tuple[int, int] | None = None, norm: str = "reference") -> None:
    """Prune `model` (a Hugging Face Llama) in place with calibration `token_ids` [N, T]."""

    def make_observer(linears):
        stats = {name: RunningSquaredNorm(linear.in_features, norm)
                 for name, linear in linears.items()}
        return (lambda name, x: stats[name].add(x)), stats

    def prune_layer(linears, stats):
        for name, linear in linears.items():
            weight = linear.weight.data
            scaler = stats[name].scaler.reshape((1, -1))  # [1, in]
            metric = torch.abs(weight) * torch.sqrt(scaler)  # [out, in]
            mask = n_of_m_mask(metric, *nm) if nm else row_mask(metric, sparsity)
            weight[mask] = 0

    layer_by_layer(model, token_ids, make_observer, prune_layer)
