"""FLAP: fluctuation-based adaptive structured pruning, with bias compensation.

An, Zhao, Yu, Tang & Wang, "Fluctuation-based Adaptive Structured Pruning for Large Language
Models", AAAI 2024 (CASIA-IVA-Lab/FLAP, `lib/prune.py: prune_flap`).
1. score: one dense pass over the calibration; per decoder layer, for each input column of o_proj
   and down_proj, the fluctuation of its input across samples times the squared norm of its
   weight column (WIFV).
2. select (AL-AM): each layer's scores standardised, averaged per head; every head and channel of
   every layer in one descending order, cut where the kept cost reaches (1 - ratio) of the total.
3. compress: remove the heads (q/k/v rows, o_proj columns) and channels (gate/up rows, down_proj
   columns); the removed columns' mean input times their weights becomes a bias of o_proj and
   down_proj (every layer gets one, zeros where nothing was removed).
Select with `pruning=flap` (conf/pruning/flap.yaml).

The defaults are the published setting (scripts/llama_7b.sh: WIFV, AL-AM, ratio 0.2, bias) in the
repository's arithmetic, quirks kept: the attention metric is squared, the MLP's is not; the first
calibration sequence only seeds the mean and the fluctuation's old mean is the updated one
(`calibration.statistics.BaselineFluctuation`); the cost of a head is 512/3 MLP channels stored
in an int64 (170, the cost of a 128-dim head whatever the head size, so with 64-dim heads AL-AM
removes more than the ratio); the compensation uses the means rounded to float16
(`bias_mean: float16`). Switches: `metric` (IFV, WIFN), `structure: UL-UM` (uniform: int(ratio x n)
heads and channels of every layer), `bias: false`, `bias_mean: float32`, and `params_removed`: the
fraction of the model's parameters to remove (`pruning.parameter_budget`), which replaces `ratio`
and counts each unit at its true parameter cost (and the added biases against the budget).
Grouped-query models (an extension; the reference is multi-head only): a unit is a key/value head
with its query heads, scored by the mean of its columns, costing int(512/3 x its query heads)
channels under the reference cost (512 for SmolLM2's groups of 3).
Measured: with the defaults, on SmolLM2-135M's exact multi-head rewrite (float16, 16 x 128
realtext tokens, ratio 0.2), the same heads and channels as the official code in all 30 layers and
bit-identical weights and compensation biases (results/benchmarks/faithful_width.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

import torch

from prunelab.calibration.passes import dense_role_statistics
from prunelab.calibration.statistics import BaselineFluctuation
from prunelab.context import PruneContext, PruneReport
from prunelab.errors import ConfigError, check_choice
from prunelab.models.adapter import ModelAdapter
from prunelab.models.width import check_width_prunable, layer_width, resize_layer
from prunelab.pruning.parameter_budget import parameters_to_remove
from prunelab.pruning.width import WidthAccount, check_width_settings, unit_costs
from prunelab.scoring.width import (FLAP_METRICS, REFERENCE_HEAD_COST, adaptive_keep, adaptive_unit_scores,
                                    compensation_bias, flap_metric, per_unit, uniform_keep)

STRUCTURES = ("AL-AM", "UL-UM")
BIAS_MEANS = ("float16", "float32")
ROLES = ("attn_out", "mlp_out")


@dataclass
class FlapScores:
    """The dense model's statistics: column metrics and input means per layer."""

    account: WidthAccount
    attn_metric: torch.Tensor  # [L, H * head_dim], squared as the reference
    mlp_metric: torch.Tensor  # [L, M]
    attn_means: list[torch.Tensor]  # per layer [H * head_dim]
    mlp_means: list[torch.Tensor]  # per layer [M]


class FLAP:
    name = "flap"
    changes_shapes = True  # the efficiency evaluator measures it by default (evaluation.efficiency)
    streamable = False

    def __init__(self, ratio: float | None = None, params_removed: float | None = None, metric: str = "WIFV",
                 structure: str = "AL-AM", bias: bool = True, bias_mean: str = "float16"):
        ratio = check_width_settings(ratio, params_removed)  # None: the reference's 0.2
        check_choice("pruning.metric", metric, FLAP_METRICS)
        check_choice("pruning.structure", structure, STRUCTURES)
        check_choice("pruning.bias_mean", bias_mean, BIAS_MEANS)
        if not isinstance(bias, bool):
            raise ConfigError(f"pruning.bias must be true or false, not {bias!r}")
        self.ratio, self.params_removed, self.metric = ratio, params_removed, metric
        self.structure, self.bias, self.bias_mean = structure, bias, bias_mean

    def check_model(self, adapter: ModelAdapter, name: str | None = None) -> None:
        """Refuse a model this method cannot prune, before any work, or say in one line that it
        prunes MLP channels only (`check_width_prunable`)."""
        check_width_prunable(adapter, self.name, name)

    def labels(self) -> dict[str, Any]:
        return {"method": self.name, "ratio": None if self.params_removed else self.ratio,
                "params_removed": self.params_removed, "metric": self.metric, "structure": self.structure}

    @torch.no_grad()
    def score(self, ctx: PruneContext) -> FlapScores:
        adapter = ctx.loaded.adapter
        account = WidthAccount(adapter, self.params_removed, self.name)  # an unsupported model fails here
        kind = "squared_norm" if self.metric == "WIFN" else "fluctuation"
        stats = dense_role_statistics(adapter, ctx.calibration(), partial(BaselineFluctuation, kind=kind),
                                      ctx.batch_size, ctx.progress, "flap statistics", roles=ROLES)
        attn, mlp = [], []
        for layer, layer_stats in zip(adapter.layers, stats):
            o, down = adapter.residual_writers(layer)
            attn.append(flap_metric(self.metric, layer_stats["attn_out"].value, o.weight).cpu() ** 2)  # [H*d]
            mlp.append(flap_metric(self.metric, layer_stats["mlp_out"].value, down.weight).cpu())  # [M]
        dtype = torch.float16 if self.bias_mean == "float16" else torch.float32
        return FlapScores(account, torch.stack(attn), torch.stack(mlp),
                          [s["attn_out"].baseline.type(dtype) for s in stats],
                          [s["mlp_out"].baseline.type(dtype) for s in stats])

    def added_parameters(self, ctx: PruneContext) -> int:
        """The compensation biases' parameters (o_proj and down_proj of every layer)."""
        adapter = ctx.loaded.adapter
        missing = [lin.bias is None for layer in adapter.layers for lin in adapter.residual_writers(layer)]
        return sum(missing) * adapter.hidden_size if self.bias else 0

    def select(self, ctx: PruneContext, scores: FlapScores) -> tuple[torch.Tensor, torch.Tensor]:
        """Keep masks of the attention units ([L, G]) and MLP channels ([L, M])."""
        adapter = ctx.loaded.adapter
        width = scores.account.width
        unit_width = width.group_size * width.head_dim
        if self.structure == "UL-UM":
            counts = scores.account.uniform_counts(self.ratio, self.added_parameters(ctx))
            heads = torch.stack([uniform_keep(per_unit(a, unit_width), counts[0]) for a in scores.attn_metric])
            return heads, torch.stack([uniform_keep(m, counts[1]) for m in scores.mlp_metric])
        attn, mlp = adaptive_unit_scores(scores.attn_metric, scores.mlp_metric, unit_width)  # [L, G], [L, M]
        if not scores.account.attention_prunable:  # a single key/value head per layer: it stays, MLP pays
            attn = torch.full_like(attn, float("inf"))
        if self.params_removed is None:  # the reference: int64 costs, keep (1 - ratio) of their total
            return adaptive_keep(attn, mlp, REFERENCE_HEAD_COST * width.group_size, 1, ratio=self.ratio)
        attn_cost, mlp_cost = unit_costs(adapter)
        total = adapter.num_layers * (attn.shape[1] * attn_cost + mlp.shape[1] * mlp_cost)
        need = parameters_to_remove(scores.account.dense_total, self.params_removed, self.added_parameters(ctx))
        costs = torch.tensor([attn_cost, mlp_cost], dtype=torch.float64)
        kept_cost = torch.tensor(total - need, dtype=torch.float64)
        return adaptive_keep(attn, mlp, costs[0], costs[1], kept_cost=kept_cost)

    @torch.no_grad()
    def prune(self, ctx: PruneContext, scores: FlapScores) -> PruneReport:
        adapter = ctx.loaded.adapter
        heads, channels = self.select(ctx, scores)
        if not scores.account.attention_prunable:  # kept whole however the cut fell (its cost counted as kept)
            heads = torch.ones_like(heads)
        for index in range(adapter.num_layers):  # every check before any weight is touched
            for what, keep in (("attention head", heads[index]), ("MLP channel", channels[index])):
                if not bool(keep.any()):
                    raise ConfigError(f"FLAP would remove every {what} of layer {index}: use a smaller "
                                      "pruning.ratio or pruning.params_removed")
        kept_heads = []
        for index, layer in enumerate(adapter.layers):
            width = layer_width(adapter, layer)
            o, down = adapter.residual_writers(layer)
            head_columns = heads[index].repeat_interleave(width.group_size * width.head_dim)  # [H * d]
            attn_bias = mlp_bias = None
            if self.bias:
                attn_bias = compensation_bias(scores.attn_means[index], head_columns, o.weight)  # [hidden]
                mlp_bias = compensation_bias(scores.mlp_means[index], channels[index], down.weight)  # [hidden]
            kept = torch.where(heads[index])[0]
            resize_layer(adapter, index, kv_heads=kept, channels=torch.where(channels[index])[0],
                         attn_out_bias=attn_bias, mlp_out_bias=mlp_bias)
            kept_heads.append(kept.tolist())
        details = {"metric": self.metric, "structure": self.structure, "bias": self.bias,
                   "width": scores.account.record(kept_heads)}
        return PruneReport(layer_targets=None, details=details)
