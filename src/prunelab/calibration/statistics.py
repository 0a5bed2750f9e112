"""Statistics of the inputs of linear layers, gathered by forward hooks during calibration.

Each statistic sees the input of one linear as [tokens, in_features] per batch, together with the
number of samples in that batch, and keeps a running value over all calibration samples. Methods
choose the statistic they need (Wanda: squared column norms; SparseGPT: the Hessian 2 X X^T / n).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Protocol

import torch
from torch import nn


class InputStatistic(Protocol):
    def update(self, x: torch.Tensor, num_samples: int) -> None:
        """x: [tokens, in_features] inputs of one batch of `num_samples` sequences."""


class SquaredColumnNorm:
    """Running mean over samples of each input channel's squared L2 norm over tokens.

    Wanda's ||X_j||_2^2 (its `scaler_row`): per batch, sum over tokens of x_j^2, divided by the total
    number of samples seen, as a running mean.
    """

    def __init__(self, in_features: int, device: torch.device | None = None):
        self.value = torch.zeros(in_features, dtype=torch.float32, device=device)  # [in]
        self.num_samples = 0

    def update(self, x: torch.Tensor, num_samples: int) -> None:
        x = x.float()
        self.value *= self.num_samples / (self.num_samples + num_samples)
        self.num_samples += num_samples
        self.value += (x * x).sum(dim=0).to(self.value.device) / self.num_samples  # [in]


class InputCollector(Protocol):
    def __call__(self, in_features: int, device: torch.device) -> InputStatistic: ...


@contextmanager
def collect_linear_inputs(
    linears: dict[str, nn.Linear], make_statistic: Callable[..., InputStatistic]
) -> Iterator[dict[str, InputStatistic]]:
    """Attach one statistic per linear for the duration of the block; hooks removed on exit."""
    stats = {name: make_statistic(lin.in_features, lin.weight.device) for name, lin in linears.items()}
    handles = []
    for name, lin in linears.items():
        def hook(_m, args, _out, stat=stats[name]):
            x = args[0]
            num_samples = x.shape[0] if x.dim() == 3 else 1
            stat.update(x.reshape(-1, x.shape[-1]).detach(), num_samples)
        handles.append(lin.register_forward_hook(hook))
    try:
        yield stats
    finally:
        for h in handles:
            h.remove()
