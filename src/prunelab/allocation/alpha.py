"""AlphaPruning: layer-wise sparsity from the heavy-tailedness of each weight matrix's spectrum.

Lu et al., "AlphaPruning: Using Heavy-Tailed Self Regularization Theory for Improved Layer-wise
Pruning of Large Language Models", NeurIPS 2024 (code: haiquanlu/AlphaPruning, `ww_sparsity`).
1. For every linear W, the eigenvalues of W^T W (squared singular values) are fitted with a power
   law: alpha = 1 + n / sum_{i >= xmin} log(lambda_i / xmin) (the Hill / maximum-likelihood
   estimator), xmin chosen by the smallest Kolmogorov-Smirnov distance among the candidates near
   the peak of the log-spectrum's histogram (`xmin: peak`, the reference's alpha_peak) or the
   median eigenvalue (`xmin: mid`). A block's alpha is the mean over its linears (block_wise).
2. Map alpha linearly to [1 - eps, 1 + eps] (eps 0.3): a lower alpha (heavier tail, better
   trained) gives a lower sparsity; s_l = S x ratio_l / mean_w(ratio), so the parameter-weighted
   mean (`mean: params`, the reference) or the plain mean (`mean: plain`) is S. The band is
   therefore [S(1 - eps), S(1 + eps)] times one common factor close to 1.
3. All linears of a block share its sparsity.
Select with `pruning/allocation=alpha` (conf/pruning/allocation/alpha.yaml). Data-free; the alphas
are cached per model.

Reference quirk (`peak_window: reference`): the candidate window's lower edge is computed as
log10(0.95 x peak) and compared with linear eigenvalues, which drops the lower edge; the default
`exact` uses the intended window [0.95 x peak, 1.5 x peak]. Equal alphas (the reference's 0/0):
S everywhere.
"""

from __future__ import annotations

import math

import torch

from prunelab.allocation.bounds import check_mean, check_targets, mean_weights
from prunelab.calibration.dense_statistics import DenseStatistics
from prunelab.errors import ConfigError

XMIN_RULES = ("peak", "mid")
WINDOWS = ("exact", "reference")


def _fit(eigs: torch.Tensor, logs: torch.Tensor, candidates: torch.Tensor
         ) -> tuple[torch.Tensor, torch.Tensor]:
    """(alpha, KS distance) of the power-law fit from each candidate xmin index. eigs, logs: [N]
    ascending; candidates: [c] indices."""
    n_eigs = eigs.numel()
    suffix = torch.flip(torch.cumsum(torch.flip(logs, [0]), 0), [0])  # [N] sum of logs[i:]
    n = (n_eigs - candidates).double()  # [c]
    alpha = 1 + n / (suffix[candidates] - n * logs[candidates])  # [c]
    j = torch.arange(n_eigs, dtype=torch.float64, device=eigs.device)  # [N]
    tail = j.unsqueeze(0) >= candidates.unsqueeze(1)  # [c, N]
    ratio = eigs.unsqueeze(0) / eigs[candidates].unsqueeze(1)  # [c, N]
    model_cdf = 1 - ratio.clamp_min(1e-300) ** (1 - alpha.unsqueeze(1))  # [c, N]
    empirical = (j.unsqueeze(0) - candidates.unsqueeze(1)) / n.unsqueeze(1)  # [c, N]
    distance = torch.where(tail, (model_cdf - empirical).abs(), torch.zeros_like(model_cdf)).amax(1)  # [c]
    return alpha, torch.where(alpha > 1, distance, torch.ones_like(distance))


def powerlaw_alpha(eigs: torch.Tensor, xmin: str = "peak", bins: int = 100,
                   peak_window: str = "exact") -> float:
    """Heavy-tail exponent of an eigenvalue spectrum ([N] eigenvalues of W^T W, any order)."""
    eigs = torch.sort(eigs.detach().double().flatten()).values  # [N] ascending
    logs = eigs.log()  # [N]
    n_eigs = eigs.numel()
    if xmin == "mid":
        alpha, _ = _fit(eigs, logs, torch.tensor([n_eigs // 2], device=eigs.device))
        return float(alpha[0])
    log10 = eigs.log10()
    low, high = float(log10.min()), float(log10.max())
    counts = torch.histc(log10, bins, min=low, max=high)  # [bins]
    edges = torch.linspace(low, high, bins + 1, dtype=torch.float64, device=eigs.device)  # [bins + 1]
    peak = 10 ** float(edges[int(torch.argmax(counts))])
    lower = math.log10(0.95 * peak) if peak_window == "reference" else 0.95 * peak
    upper = 1.5 * peak
    alphas = torch.zeros(n_eigs - 1, dtype=torch.float64, device=eigs.device)  # [N - 1] reference: 0 and D = 1 if skipped
    distances = torch.ones(n_eigs - 1, dtype=torch.float64, device=eigs.device)
    inside = torch.nonzero((eigs[:-1] >= lower) & (eigs[:-1] <= upper)).flatten()  # [c]
    for chunk in inside.split(256):
        alphas[chunk], distances[chunk] = _fit(eigs, logs, chunk)
    return float(alphas[int(torch.argmin(distances))])


def alpha_sparsities(alphas: list[float], target: float, epsilon: float,
                     weights: torch.Tensor) -> list[float]:
    """s_l = target x r_l / sum_l(w_l r_l), r_l = 1 - eps + 2 eps (a_l - min a) / (max a - min a)."""
    a = torch.as_tensor(alphas, dtype=torch.float64)  # [L]
    spread = a.max() - a.min()
    if not torch.isfinite(spread) or spread <= 0:
        return [float(target)] * a.numel()
    ratio = (a - a.min()) / spread * (2 * epsilon) + (1 - epsilon)  # [L] in [1 - eps, 1 + eps]
    return (target * ratio / (ratio * weights).sum()).tolist()


class AlphaPruning:
    name = "alpha"

    def __init__(self, epsilon: float = 0.3, mean: str = "params", xmin: str = "peak", bins: int = 100,
                 peak_window: str = "exact"):
        if not 0.0 <= epsilon < 1.0:
            raise ConfigError(f"pruning.allocation.epsilon={epsilon} must be in [0, 1)")
        if xmin not in XMIN_RULES or peak_window not in WINDOWS or bins < 1:
            raise ConfigError(f"pruning.allocation: xmin must be one of {XMIN_RULES}, peak_window one of "
                              f"{WINDOWS}, bins >= 1")
        check_mean(mean, self.name)
        self.epsilon, self.mean, self.xmin = epsilon, mean, xmin
        self.bins, self.peak_window = bins, peak_window
        self.details: dict = {}

    def alphas(self, stats: DenseStatistics) -> list[list[float]]:
        """Per block, the alpha of each of its linears (cached per model)."""
        @torch.no_grad()
        def compute():
            return [[powerlaw_alpha(torch.linalg.svdvals(w.float()) ** 2, self.xmin, self.bins,
                                    self.peak_window) for w in weights]
                    for weights in stats.linear_weights()]
        params = {"xmin": self.xmin, "bins": self.bins, "peak_window": self.peak_window}
        return stats.cached("esd_alpha", params, compute, uses_calibration=False)

    def allocate(self, target: float, stats: DenseStatistics) -> list[float]:
        per_linear = self.alphas(stats)
        block = [sum(a) / len(a) for a in per_linear]
        layer_params = stats.layer_params()
        weights = mean_weights(layer_params, self.mean)
        targets = check_targets(alpha_sparsities(block, target, self.epsilon, weights), target, weights,
                                self.name)
        self.details = {"alphas": block, "linear_alphas": per_linear, "epsilon": self.epsilon,
                        "mean": self.mean, "xmin": self.xmin, "layer_params": layer_params}
        return targets
