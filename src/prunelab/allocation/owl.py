"""OWL: outlier-weighed layer-wise sparsity.

Yin et al., "Outlier Weighed Layerwise Sparsity (OWL): A Missing Secret Sauce for Pruning LLMs to
High Sparsity", 2023 (code: luuyin/OWL, `prune_wanda_outlier`).
1. Dense pass: per block, D_l = fraction of the block's Wanda scores |W| * ||X||_2 (all its linears
   together) above `outlier_m` x their mean.
2. Normalise D to [0, 2 lambda]; density_l = D_l - mean(D) + (1 - S), i.e. s_l = S - (D_l - mean D).
3. All linears of a block share s_l: more outliers, lower sparsity.
Select with `pruning/allocation=owl` (conf/pruning/allocation/owl.yaml).

The band is 2 lambda wide and centred on the mean of D, not on S, so one block can sit more than
lambda from S (as in the reference). `mean: plain` (the reference) takes the plain mean over blocks;
`mean: params` the parameter-weighted one. Reference quirk not reproduced: equal outlier ratios
divide by zero (NaN); here every block gets S. The reference's README runs use M = 5 (its argparse
default is 3) and lambda 0.08. The squared input norms come from a cached dense pass
(`DenseStatistics.squared_input_norms` in `calibration.dense_statistics`), so a sweep over M,
lambda and S reuses them.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from prunelab.allocation.bounds import check_bound, check_mean, check_targets, mean_weights
from prunelab.calibration.dense_statistics import DenseStatistics
from prunelab.errors import ConfigError
from prunelab.scoring.weights import wanda_scores


def outlier_ratio(scores: Sequence[torch.Tensor], m: float) -> float:
    """Fraction of the scores (all matrices of a block together, each [out, in]) above m x their
    mean; two passes instead of one concatenated copy of the block."""
    total = sum(s.numel() for s in scores)
    mean = sum(float(s.double().sum()) for s in scores) / total
    return sum(int((s > mean * m).sum()) for s in scores) / total


def owl_sparsities(ratios: Sequence[float], target: float, lam: float, weights: torch.Tensor) -> list[float]:
    """s_l = target - (D'_l - mean_w D'), D' the outlier ratios scaled to [0, 2 lam].

    ratios: [layers] outlier ratios; weights: [layers] mean weights summing to 1.
    """
    d = torch.as_tensor(ratios, dtype=torch.float64)  # [L]
    spread = d.max() - d.min()
    if not torch.isfinite(spread) or spread <= 0:
        return [float(target)] * d.numel()
    d = (d - d.min()) / spread * (2 * lam)  # [L] in [0, 2 lam]
    return (target - (d - (d * weights).sum())).tolist()


class OWL:
    name = "owl"

    def __init__(self, outlier_m: float = 5.0, lam: float = 0.08, mean: str = "plain"):
        if outlier_m <= 0:
            raise ConfigError(f"pruning.allocation.outlier_m={outlier_m} must be > 0")
        check_bound(lam, self.name, "lam")
        check_mean(mean, self.name)
        self.outlier_m, self.lam, self.mean = outlier_m, lam, mean
        self.details: dict = {}

    @torch.no_grad()
    def allocate(self, target: float, stats: DenseStatistics) -> list[float]:
        ratios = []
        for by_role, norms in zip(stats.role_weights(), stats.squared_input_norms()):
            scores = [wanda_scores(w, norms[role])  # [out, in]
                      for role, weights in by_role.items() for w in weights]
            ratios.append(outlier_ratio(scores, self.outlier_m))
        weights = mean_weights(stats.layer_params(), self.mean)
        targets = check_targets(owl_sparsities(ratios, target, self.lam, weights), target, weights, self.name)
        self.details = {"outlier_ratios": ratios, "outlier_m": self.outlier_m, "lam": self.lam,
                        "mean": self.mean}
        return targets
