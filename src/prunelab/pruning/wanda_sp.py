"""Wanda-sp: Wanda's score summed into heads and channels, pruned layer by layer.

The structured Wanda baseline of An et al., "Fluctuation-based Adaptive Structured Pruning for
Large Language Models", AAAI 2024 (CASIA-IVA-Lab/FLAP, `lib/prune.py: prune_wanda_sp`), from Sun
et al.'s Wanda (2023).
1. Layer by layer (the pruned layer's outputs feed the next), the squared input norms ||X_j||^2 of
   o_proj and down_proj from one forward pass of the layer.
2. Column score: the mean over output rows of |W_ij| ||X_j||; a head's is the sum of its columns'.
3. Remove int(ratio x heads) heads and int(ratio x channels) channels of every layer: every unit
   scoring at least the k-th smallest is kept (ties kept). No compensation bias.
Select with `pruning=wanda_sp` (conf/pruning/wanda_sp.yaml). The defaults are the reference's
(ratio 0.2). `params_removed` replaces the ratio by the fraction of the model's parameters to
remove: heads at that fraction of the decoder layers (floored), channels for the rest
(`pruning.parameter_budget.uniform_counts`). Grouped-query models (an extension): a unit is a
key/value head with its query heads, int(ratio x key/value heads) of them go (none at 0.2 with 3
key/value heads). Measured: with the defaults, on SmolLM2-135M's exact multi-head
rewrite (float16, 16 x 128 realtext tokens, ratio 0.2), the same heads and channels as the
official code in all 30 layers and bit-identical weights (results/benchmarks/faithful_width.md).
"""

from __future__ import annotations

from functools import partial
import torch

from prunelab.calibration.passes import layer_pass, role_linears, role_readers
from prunelab.calibration.statistics import SquaredColumnNorm, collect_linear_inputs
from prunelab.context import PruneContext, PruneReport
from prunelab.pruning.width import UniformWidthPruning, WidthAccount, prune_layer_uniformly
from prunelab.scoring.weights import wanda_scores
from prunelab.scoring.width import wanda_sp_column_scores

ROLES = ("attn_out", "mlp_out")


class WandaSP(UniformWidthPruning):
    name = "wanda_sp"

    @torch.no_grad()
    def prune(self, ctx: PruneContext, plan: tuple[WidthAccount, tuple[int, int]]) -> PruneReport:
        account, counts = plan
        adapter = ctx.loaded.adapter
        statistic = partial(SquaredColumnNorm, arithmetic="reference")
        kept_heads = []
        steps = layer_pass(adapter, ctx.calibration(), ctx.batch_size, "pruned", ctx.progress, desc="wanda_sp")
        for step in steps:
            groups = role_linears(adapter, step.layer, ROLES)
            with collect_linear_inputs(role_readers(groups), statistic) as norms:
                step.forward()
            o, down = adapter.residual_writers(step.layer)
            attn = wanda_sp_column_scores(wanda_scores(o.weight, norms["attn_out"].value))  # [H * d]
            mlp = wanda_sp_column_scores(wanda_scores(down.weight, norms["mlp_out"].value))  # [M]
            kept_heads.append(prune_layer_uniformly(adapter, step.index, attn, mlp, counts))
        return PruneReport(layer_targets=None, details={"width": account.record(kept_heads)})
