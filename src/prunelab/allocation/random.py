"""Random layer-wise sparsity: the baseline an allocation policy has to beat.

PALS (the seed paper) reports that gradient-magnitude allocation does worse than random allocation;
this policy makes that claim testable.
1. Draw one uniform number per block with a generator seeded by the run's seed (`stats.seed`).
2. Map the draws affinely into [S - bound, S + bound] (bound 0.05) with the mean (`mean: plain` or
   `params`) exactly S (`allocation.bounds.centred_band`).
3. All linears of a block share its sparsity.
Select with `pruning/allocation=random` (conf/pruning/allocation/random.yaml). No data, no model pass:
the same seed gives the same allocation, another seed another one.
"""

from __future__ import annotations

import torch

from prunelab.allocation.bounds import Band
from prunelab.calibration.dense_statistics import DenseStatistics


class RandomAllocation:
    name = "random"

    def __init__(self, bound: float = 0.05, mean: str = "plain"):
        self.band = Band(self.name, bound, mean)
        self.validate = self.band.validate
        self.details: dict = {}

    def allocate(self, target: float, stats: DenseStatistics) -> list[float]:
        self.validate(target)
        generator = torch.Generator().manual_seed(int(stats.seed))
        draws = torch.rand(stats.num_layers, generator=generator, dtype=torch.float64)  # [L]
        targets = self.band.targets(draws.tolist(), target, stats.layer_params(),
                                    higher_means_denser=False)
        self.details = {"draws": draws.tolist(), "seed": int(stats.seed), **self.band.details()}
        return targets
