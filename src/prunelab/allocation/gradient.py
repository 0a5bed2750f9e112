"""Gradient-magnitude layer-wise sparsity: blocks whose weights get larger loss gradients keep more.

The baseline the PALS paper (the seed method) compares against, and reports worse than random.
1. On the dense model, back-propagate the calibration LM loss (next-token cross-entropy, mean over
   tokens) one sequence at a time, and accumulate, per block, the squared gradient entries of all
   its linears' weights; g_l = sqrt(sum / (sequences x weights)), the RMS gradient per weight.
2. Map affinely into [S - bound, S + bound] (bound 0.05): a higher gradient gives a lower sparsity,
   with the mean (`mean: plain` or `params`) exactly S (`allocation.bounds.centred_band`).
3. All linears of a block share its sparsity.
Select with `pruning/allocation=gradient` (conf/pruning/allocation/gradient.yaml).

One sequence per backward pass keeps the statistic independent of the calibration batch size.
Memory: a full forward and backward of the model plus one gradient per linear weight (as large as
the linears themselves); on a streamed model (`model.streaming`) the backward visits one layer at
a time, with every layer's input kept (`calibration.gradients.backward_by_layer`). The gradients (`DenseStatistics.squared_gradients` in
`calibration.dense_statistics`) are cached per model and calibration data.
Half precision: a float16 model's backward is loss-scaled (its small gradients would flush to zero,
leaving layers at 0), and every squared sum is taken in float64 from float32-unscaled gradients
(`calibration.gradients`); a float32 model's statistic is unchanged.
"""

from __future__ import annotations

import torch

from prunelab.allocation.bounds import Band
from prunelab.calibration.dense_statistics import DenseStatistics


class GradientAllocation:
    name = "gradient"
    layer_gradients = True  # back-propagates: its graph and gradient sums are planned (models.memory)
    offloadable = False  # back-propagates through the whole model (accelerate-offloaded weights: none)

    def __init__(self, bound: float = 0.05, mean: str = "plain"):
        self.band = Band(self.name, bound, mean)
        self.validate = self.band.validate
        self.details: dict = {}

    def allocate(self, target: float, stats: DenseStatistics) -> list[float]:
        self.validate(target)
        squared = stats.squared_gradients()  # [L]
        sequences = stats.calibration_sequences()
        layer_params = stats.layer_params()
        params = torch.tensor(layer_params, dtype=torch.float64)  # [L]
        gradients = (squared / (sequences * params)).sqrt().tolist()
        targets = self.band.targets(gradients, target, layer_params)
        self.details = {"gradients": gradients, **self.band.details()}
        return targets
