"""DLP: dynamic layer-wise pruning, layer sparsities from each layer's mean Wanda score.

Chen et al., "DLP: Dynamic Layerwise Pruning in Large Language Models", 2025, arXiv 2505.23807 (code:
ironartisan/DLP, `lib/prune.py` `get_dlp_ratios`, `run.py --prune_method wanda_dlp --alpha 0.15`).
1. Dense pass: per decoder layer, I_l = |mean of the Wanda scores |W| ||X||_2 of all its linears'
   entries together| (a parameter-weighted mean: the MLP dominates), whatever the base pruner.
2. r_l = 1 - I_l / sum(I), min-max scaled to [0, 2 alpha], shifted so that the plain mean over
   layers is 1 - S: density d_l. A layer with a higher score gets a HIGHER sparsity.
3. s_l = 1 - d_l, raised to 0.01 where <= 0 (no upper clamp).
Select with `pruning/allocation=dlp` (conf/pruning/allocation/dlp.yaml).

The arithmetic is the reference's: scores and scaling in float32 (mean over the concatenated scores,
the sum over layers as Python adds tensors), the shift's plain mean over layers, the sparsity
1 - d_l in Python float; the mean of the targets is S only up to float32 rounding (and the 0.01
floor). The squared input norms come from the cached dense pass (`DenseStatistics`), as OWL's do.
Measured against the official `get_dlp_ratios` over all 30 layers of SmolLM2-135M (realtext 32 x 256,
seed 0, alpha 0.15, at 50% and at the README's 70%): the same layer sparsities, bit for bit
(results/benchmarks/official_dlp.md); `pruning=wanda pruning/allocation=dlp` against the README
command (`--prune_method wanda_dlp --alpha 0.15`) at 70%: 0 of 106,168,320 mask entries differ.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from prunelab.allocation.bounds import check_bound
from prunelab.calibration.dense_statistics import DenseStatistics
from prunelab.errors import ConfigError
from prunelab.scoring.weights import wanda_scores

#: the reference's floor for a layer whose sparsity comes out <= 0
FLOOR = 0.01


def layer_score(scores: Sequence[torch.Tensor]) -> torch.Tensor:
    """|mean| of one layer's scores (each [out, in], in module order) concatenated, float32 (0-d)."""
    return torch.abs(torch.mean(torch.cat([s.flatten().cpu() for s in scores]).float()))


def dlp_sparsities(layer_scores: Sequence[torch.Tensor], target: float, alpha: float) -> list[float]:
    """s_l from the per-layer scores ([layers] 0-d float32 tensors), in the reference's arithmetic."""
    total = sum(layer_scores)  # 0-d float32, added layer by layer
    imp = torch.tensor([1 - score / total for score in layer_scores])  # [L] float32, on the CPU as the scores (L numbers)
    low, high = torch.min(imp), torch.max(imp)
    scaled = (imp - low) * (1 / (high - low) * alpha * 2)  # [L] in [0, 2 alpha]
    density = (scaled - torch.mean(scaled) + (1 - target)).tolist()
    return [FLOOR if 1 - d <= 0 else 1 - d for d in density]


class DLP:
    name = "dlp"

    def __init__(self, alpha: float = 0.15):
        check_bound(alpha, self.name, "alpha")
        self.alpha = alpha
        self.details: dict = {}

    @torch.no_grad()
    def allocate(self, target: float, stats: DenseStatistics) -> list[float]:
        scores = []
        for by_role, norms in zip(stats.role_weights(), stats.squared_input_norms()):
            scores.append(layer_score([wanda_scores(w, norms[role])  # [out, in]
                                       for role, weights in by_role.items() for w in weights]))
        if len(scores) < 2 or float(max(scores) - min(scores)) == 0:
            targets = [float(target)] * len(scores)  # the reference divides by zero here
        else:
            targets = dlp_sparsities(scores, target, self.alpha)
        if any(t >= 1 for t in targets):
            raise ConfigError(f"dlp allocation gives layer sparsities >= 1 at sparsity {target:g} with "
                              f"alpha={self.alpha}: lower alpha or the sparsity")
        self.details = {"layer_scores": [float(s) for s in scores], "alpha": self.alpha}
        return targets
