"""Statistics of the inputs of linear layers, gathered by forward hooks during calibration.

Each statistic sees the input of one linear as [tokens, in_features] per batch, together with the
number of samples in that batch, and keeps a running value over all calibration samples. Methods
choose the statistic they need (Wanda: squared column norms; SparseGPT: the Hessian 2 X X^T / n).
Every running value is float32 or wider whatever the model's dtype: a half-precision input is cast
up before it is squared or summed (FLAP's mean increment alone is computed in the input's dtype,
as its reference computes it), so a bfloat16 or float16 model's statistics do not accumulate
rounding in 8 or 11 mantissa bits.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Protocol

import torch
from torch import nn


class InputStatistic(Protocol):
    def update(self, x: torch.Tensor, num_samples: int) -> None:
        """x: [tokens, in_features] inputs of one batch of `num_samples` sequences."""


NORM_ARITHMETIC = ("reference", "sum_of_squares")


class SquaredColumnNorm:
    """Running mean over samples of each input channel's squared L2 norm over tokens.

    Wanda's ||X_j||_2^2 (its `scaler_row`). Per batch of b samples after n seen:
    s *= n / (n + b); n += b; s += v / n, where v is the batch's squared column norm computed as
    - `reference` (default): torch.norm(X, p=2, dim=1) ** 2 on X = x^T [in, tokens], the Wanda
      repository's arithmetic (`WrappedGPT.add_batch`);
    - `sum_of_squares`: sum over tokens of x_j^2. Equal in exact arithmetic, but float rounding
      differs and near-ties in the scores flip (measured on SmolLM2-135M at 50%: 1,232 of 106M mask
      entries, all in layers 26-29).
    """

    def __init__(self, in_features: int, device: torch.device | None = None,
                 arithmetic: str = "reference"):
        if arithmetic not in NORM_ARITHMETIC:
            raise ValueError(f"arithmetic={arithmetic!r} is not one of {NORM_ARITHMETIC}")
        self.arithmetic = arithmetic
        self.value = torch.zeros(in_features, dtype=torch.float32, device=device)  # [in]
        self.num_samples = 0

    def update(self, x: torch.Tensor, num_samples: int) -> None:
        x = x.float()  # [tokens, in]
        self.value *= self.num_samples / (self.num_samples + num_samples)
        self.num_samples += num_samples
        if self.arithmetic == "reference":
            batch = torch.norm(x.t(), p=2, dim=1) ** 2  # [in]
        else:
            batch = (x * x).sum(dim=0)  # [in]
        self.value += batch.to(self.value.device) / self.num_samples  # [in]


class Hessian:
    """SparseGPT's layer Hessian H = (2/n) sum over samples of X X^T, in fp32.

    The reference's running update per batch of b samples: H *= n / (n + b); n += b;
    X *= sqrt(2 / n); H += X X^T (X: [in, tokens]).
    """

    def __init__(self, in_features: int, device: torch.device | None = None):
        self.value = torch.zeros(in_features, in_features, dtype=torch.float32, device=device)  # [in, in]
        self.num_samples = 0

    def update(self, x: torch.Tensor, num_samples: int) -> None:
        self.value *= self.num_samples / (self.num_samples + num_samples)
        self.num_samples += num_samples
        x = math.sqrt(2 / self.num_samples) * x.float().to(self.value.device)  # [tokens, in]
        self.value += x.T @ x  # [in, in]


class GramSum:
    """ALPS's X^T X: the plain sum over calibration tokens (no 2/n scaling), in float32.

    Added one sequence at a time as the reference does (mazumder-lab/ALPS `ALPS_prune.add_batch`,
    one sample per forward pass: `inp.matmul(inp.t())` on inp = x^T [in, tokens]), so the sum does
    not depend on the calibration batch size.
    """

    def __init__(self, in_features: int, device: torch.device | None = None):
        self.value = torch.zeros(in_features, in_features, dtype=torch.float32, device=device)  # [in, in]
        self.num_samples = 0

    def update(self, x: torch.Tensor, num_samples: int) -> None:
        for sample in x.chunk(num_samples, dim=0):  # each [T, in]
            inp = sample.t().float()  # [in, T]
            self.value += inp.matmul(inp.t()).to(self.value.device)
        self.num_samples += num_samples


FLUCTUATION_KINDS = ("fluctuation", "squared_norm")


class BaselineFluctuation:
    """FLAP's input statistics (An et al. 2024; FLAP `lib/layerwrapper.py`, `BiasGPT`), per sample.

    Per input channel j: the running mean of x_j over tokens and samples (the baseline, whose
    removed channels give the compensation bias) and either its fluctuation (`kind="fluctuation"`,
    the IFV/WIFV metrics: a running sample variance over samples of sum_t (x_tj - mean_j)^2 / n)
    or its mean squared norm (`kind="squared_norm"`, WIFN). Updated one calibration sequence at a
    time in the reference's arithmetic, so that the metric matches it bit for bit:
    - the reference's Welford step reads the old mean after it was updated in place (both names
      hold one tensor), so the fluctuation measures deviations from the new mean twice;
    - the first sequence only seeds the mean (its fluctuation is set to 0);
    - the mean's increment is computed in the input's dtype, the rest in float32.
    """

    def __init__(self, in_features: int, device: torch.device | None = None, kind: str = "fluctuation"):
        if kind not in FLUCTUATION_KINDS:
            raise ValueError(f"kind={kind!r} is not one of {FLUCTUATION_KINDS}")
        self.kind = kind
        self.baseline = torch.zeros(in_features, dtype=torch.float32, device=device)  # [in]
        self.value = torch.zeros(in_features, dtype=torch.float32, device=device)  # [in]
        self.num_samples = 0

    def update(self, x: torch.Tensor, num_samples: int) -> None:
        for sample in x.reshape(num_samples, -1, x.shape[-1]):  # [tokens of one sequence, in]
            self._update_one(sample.t())

    def _update_one(self, inp: torch.Tensor) -> None:
        """inp: [in, tokens] (a transposed view, as the reference holds it)."""
        n = self.num_samples
        self.baseline *= n / (n + 1)
        self.baseline += torch.mean(inp, dim=1) / (n + 1)  # [in]; the old mean is gone (the quirk)
        if self.kind == "squared_norm":
            self.value *= n / (n + 1)
            self.value += torch.norm(inp.type(torch.float32), p=2, dim=1) ** 2 / (n + 1)  # [in]
        elif n > 0:
            self.value *= (n - 1) / n
            centred = inp - self.baseline.unsqueeze(1)  # [in, tokens]
            self.value += torch.sum(centred * centred, dim=1) / (n + 1)  # [in]
        self.num_samples = n + 1


class InputMoments:
    """DSnoT's input statistics of one linear, updated one calibration sample at a time.

    Zhang et al., "Dynamic Sparse No Training", ICLR 2024 (zyxxmu/DSnoT `WrappedGPT.add_batch`),
    in that repository's arithmetic on X = x^T [in, tokens] of each sample:
    - `sq_norm`: Wanda's running mean over samples of torch.norm(X, dim=1) ** 2 (`scaler_row`);
    - `sum_mean`: the running mean over samples of each channel's SUM over tokens,
      s *= n / (n + 1); n += 1; s += X.sum(dim=1) / n (`sum_metric_row`: seqlen x the mean);
    - `variance`: each sample's own population variance over its tokens, combined as a
      token-weighted mean, v = (v * N + v_b * T) / (N + T) (`var`: not the variance of the pooled
      tokens, which would add the spread of the sample means).
    A batch of B samples ([B * T, in]) is split into its samples, so the values do not depend on
    the calibration batch size (the repository runs one sample per forward pass).
    """

    def __init__(self, in_features: int, device: torch.device | None = None):
        self.sq_norm = torch.zeros(in_features, dtype=torch.float32, device=device)  # [in]
        self.sum_mean = torch.zeros(in_features, dtype=torch.float32, device=device)  # [in]
        self.variance = torch.zeros(in_features, dtype=torch.float32, device=device)  # [in]
        self.num_samples = 0
        self.num_tokens = 0

    def update(self, x: torch.Tensor, num_samples: int) -> None:
        for sample in x.float().chunk(num_samples, dim=0):  # each [T, in]
            columns = sample.t()  # [in, T], the repository's layout (reductions run along dim 1)
            tokens = columns.shape[1]
            variance = torch.var(columns, dim=1, unbiased=False).to(self.variance.device)  # [in]
            self.variance = variance if self.num_tokens == 0 else (
                (self.variance * self.num_tokens + variance * tokens) / (self.num_tokens + tokens))
            self.num_tokens += tokens
            self.sq_norm *= self.num_samples / (self.num_samples + 1)
            self.sum_mean *= self.num_samples / (self.num_samples + 1)
            self.num_samples += 1
            sq_norm = torch.norm(columns, p=2, dim=1) ** 2  # [in]
            self.sq_norm += sq_norm.to(self.sq_norm.device) / self.num_samples
            self.sum_mean += torch.sum(columns, dim=1).to(self.sum_mean.device) / self.num_samples


class AbsHistogram:
    """Counts of |x| over log-spaced bins, for percentiles of activation magnitudes that do not
    need every activation in memory (PALS). Relative resolution: a factor (high/low)^(1/bins) per
    bin (about 0.9% with the defaults); values below `low` (zeros too) go to an underflow bin,
    values above `high` to an overflow bin.
    """

    def __init__(self, in_features: int | None = None, device: torch.device | None = None,
                 bins: int = 4096, low: float = 1e-8, high: float = 1e8):
        self.low, self.high, self.bins = low, high, bins
        self.counts = torch.zeros(bins + 2, dtype=torch.float64)  # [underflow, bins..., overflow]

    def update(self, x: torch.Tensor, num_samples: int) -> None:
        logs = x.detach().float().abs().clamp_min(1e-30).log10().flatten()  # [tokens * in]
        lo, hi = math.log10(self.low), math.log10(self.high)
        index = ((logs - lo) / (hi - lo) * self.bins).floor().clamp(-1, self.bins) + 1  # 0 = underflow
        self.counts += torch.bincount(index.long(), minlength=self.bins + 2).double().cpu()


def histogram_quantile(counts: torch.Tensor, q: float, low: float = 1e-8, high: float = 1e8) -> float:
    """The q-quantile (0 < q <= 1) of |x| from `AbsHistogram` counts ([bins + 2]), interpolated
    log-linearly inside its bin; 0.0 if it falls in the underflow bin, `high` in the overflow bin."""
    bins = counts.numel() - 2
    cumulative = torch.cumsum(counts.double(), 0)  # [bins + 2]
    rank = q * float(cumulative[-1])
    index = int(torch.searchsorted(cumulative, torch.tensor([rank], dtype=torch.float64))[0])
    index = min(index, bins + 1)
    if index == 0:
        return 0.0
    if index == bins + 1:
        return high
    before = float(cumulative[index - 1])
    fraction = (rank - before) / max(float(counts[index]), 1e-300)
    lo, hi = math.log10(low), math.log10(high)
    return 10 ** (lo + (index - 1 + fraction) * (hi - lo) / bins)


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
