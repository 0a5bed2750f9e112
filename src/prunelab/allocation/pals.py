"""PALS: per-layer sparsity from a high percentile of activation magnitudes (the seed method).

PALS (the project's seed paper; no public code). Claim: LLaMA-2-7B, Wanda 50%, uniform 12.92 vs
PALS 10.96 perplexity (mean of 9 runs).
1. Dense pass: per block, the `percentile`-th percentile (99) of |x| over every activation entering
   the block's linears (one input per role: attention input, attention output, MLP input, MLP
   hidden), over all calibration tokens.
2. Map affinely into [S - bound, S + bound] (bound 0.05): a higher percentile gives a lower sparsity;
   the layer farthest from the mean percentile sits on the bound, and the mean (`mean: plain` or
   `params`) is exactly S (`allocation.bounds.centred_band`).
3. All linears of a block share its sparsity.
Select with `pruning/allocation=pals` (conf/pruning/allocation/pals.yaml).

Which activations: the inputs of the layer's linears, not the hidden states entering the block.
They are what the pruned weights multiply (a linear's pruning error is (W - W') X with X its input),
and they carry the norm's learned per-channel scale, where LLM outlier features show; the residual
stream entering a block grows with depth by accumulation (and its massive activations are absorbed
by the norm), so its percentile would mostly encode depth. The percentile is read from a log-binned
histogram (`calibration.statistics.AbsHistogram`, about 1% relative resolution), so no activation is
kept; the cached histograms serve every percentile, bound and sparsity of a sweep.
"""

from __future__ import annotations

from prunelab.allocation.bounds import Band
from prunelab.calibration.dense_statistics import DenseStatistics
from prunelab.calibration.statistics import histogram_quantile
from prunelab.errors import ConfigError

BINS, LOW, HIGH = 4096, 1e-8, 1e8


class PALS:
    name = "pals"

    def __init__(self, percentile: float = 99.0, bound: float = 0.05, mean: str = "plain"):
        if not 0.0 < percentile <= 100.0:
            raise ConfigError(f"pruning.allocation.percentile={percentile} must be in (0, 100]")
        self.percentile, self.band = percentile, Band(self.name, bound, mean)
        self.validate = self.band.validate
        self.details: dict = {}

    def allocate(self, target: float, stats: DenseStatistics) -> list[float]:
        self.validate(target)
        counts = stats.abs_histograms(BINS, LOW, HIGH)  # [L, bins + 2], cached
        percentiles = [histogram_quantile(c, self.percentile / 100.0, LOW, HIGH) for c in counts]
        targets = self.band.targets(percentiles, target, stats.layer_params())
        self.details = {"percentiles": percentiles, "percentile": self.percentile, **self.band.details()}
        return targets
