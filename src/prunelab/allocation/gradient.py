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
the linears themselves); the gradients are cached per model and calibration data.
"""

from __future__ import annotations

import torch
from tqdm.auto import tqdm

from prunelab.allocation.bounds import Band, layer_params
from prunelab.allocation.stats_cache import cached
from prunelab.calibration.gradients import gradients_for, next_token_loss
from prunelab.context import PruneContext


def squared_gradients(ctx: PruneContext) -> torch.Tensor:
    """[layers] sum over sequences of the squared loss gradients of each block's linear weights."""
    adapter = ctx.loaded.adapter
    model = adapter.model
    samples = ctx.calibration()  # [N, T]
    linears = [list(adapter.linears(layer).values()) for layer in adapter.layers]
    device = model.get_input_embeddings().weight.device
    total = torch.zeros(len(linears), dtype=torch.float64)  # [L]
    with gradients_for(model, (lin.weight for layer in linears for lin in layer)):
        for ids in tqdm(samples.split(1), desc="gradient: dense backward", disable=not ctx.progress,
                        leave=False):
            next_token_loss(model, ids.to(device)).backward()  # ids [1, T]
            for index, layer in enumerate(linears):
                for lin in layer:
                    total[index] += float(lin.weight.grad.double().pow(2).sum())
                    lin.weight.grad = None
    return total


class GradientAllocation:
    name = "gradient"

    def __init__(self, bound: float = 0.05, mean: str = "plain"):
        self.band = Band(self.name, bound, mean)
        self.validate = self.band.validate
        self.details: dict = {}

    def allocate(self, target: float, ctx: PruneContext) -> list[float]:
        self.validate(target)
        squared = cached(ctx, "linear_weight_gradient_sq", {"loss": "next_token_ce", "per": "sequence"},
                         lambda: squared_gradients(ctx))  # [L]
        sequences = ctx.calibration().shape[0]
        params = torch.tensor(layer_params(ctx), dtype=torch.float64)  # [L]
        gradients = (squared / (sequences * params)).sqrt().tolist()
        targets = self.band.targets(gradients, target, ctx)
        self.details = {"gradients": gradients, **self.band.details()}
        return targets
