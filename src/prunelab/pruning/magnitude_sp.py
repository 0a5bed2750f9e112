"""Magnitude-sp: heads and channels ranked by the norms of their output-projection columns.

The data-free structured baseline of An et al., "Fluctuation-based Adaptive Structured Pruning for
Large Language Models", AAAI 2024 (CASIA-IVA-Lab/FLAP, `lib/prune.py: prune_magnitude_sp`).
1. Column score: the L2 norm of each input column of o_proj and down_proj (in the weight's dtype);
   a head's is the sum of its columns'.
2. Remove int(ratio x heads) heads and int(ratio x channels) channels of every layer: every unit
   scoring at least the k-th smallest is kept (ties kept). No compensation bias.
Select with `pruning=magnitude_sp` (conf/pruning/magnitude_sp.yaml). The defaults are the
reference's (ratio 0.2); `params_removed` and grouped-query models as in `pruning.wanda_sp`.
Measured: with the defaults, on SmolLM2-135M's exact multi-head
rewrite (float16, 16 x 128 realtext tokens, ratio 0.2), the same heads and channels as the
official code in all 30 layers and bit-identical weights (results/benchmarks/faithful_width.md).
"""

from __future__ import annotations

import torch

from prunelab.context import PruneContext, PruneReport
from prunelab.pruning.width import UniformWidthPruning, WidthAccount, prune_layer_uniformly
from prunelab.scoring.width import magnitude_sp_column_scores


class MagnitudeSP(UniformWidthPruning):
    name = "magnitude_sp"

    @torch.no_grad()
    def prune(self, ctx: PruneContext, plan: tuple[WidthAccount, tuple[int, int]]) -> PruneReport:
        account, counts = plan
        adapter = ctx.loaded.adapter
        kept_heads = []
        for index, layer in enumerate(adapter.layers):
            o, down = adapter.residual_writers(layer)
            attn, mlp = magnitude_sp_column_scores(o.weight), magnitude_sp_column_scores(down.weight)
            kept_heads.append(prune_layer_uniformly(adapter, index, attn, mlp, counts))
        return PruneReport(layer_targets=None, details={"width": account.record(kept_heads)})
