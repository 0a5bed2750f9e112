"""LLM-Pruner: gradient-based structural pruning of coupled heads and channels (block-wise).

Ma, Fang & Wang, "LLM-Pruner: On the Structural Pruning of Large Language Models", NeurIPS 2023
(horseee/LLM-Pruner, `hf_prune.py --block_wise`, `LLMPruner/pruner/hf_llama_pruner.py`,
`LLMPruner/torch_pruning/pruner/algorithms/metapruner.py`); the LoRA recovery step is not part of
this method (any `recovery=` can follow).
1. Dependency groups of each pruned decoder layer: an attention unit is a key/value head with its
   query heads (its q/k/v rows, its o_proj columns), an MLP unit one channel (its gate/up rows,
   its down_proj column).
2. Importance: one backward pass of the calibration LM loss; per weight the Taylor salience
   |W dL/dW| (`taylor`), per channel of each member summed over the other dimension, the members
   combined per channel by `grouping_strategy` (sum), then summed over a head's head_dim channels.
3. In every pruned layer remove the lowest-scoring units: C - int(C x (1 - ratio)) of the C
   channels of q_proj (floored to whole heads) and of gate_proj. Pure slicing, no weight merged.
Select with `pruning=llm_pruner` (conf/pruning/llm_pruner.yaml). The defaults are the README's
LLaMA setting (`--pruning_ratio 0.25 --block_wise --pruner_type taylor --taylor param_first`,
grouping sum, layers 4..29 of 32); the reference calibrates on 10 bookcorpus sequences of 64
tokens in one batch: `data.calibration.nsamples=10 data.calibration.seqlen=64
runtime.calibration_batch_size=10` (in batches, the gradient is their size-weighted mean).

Layers: `layer_start` / `layer_end` (exclusive) index the decoder layers, a negative end counting
from the last: the default 4 / -2 keeps the first 4 and the last 2 layers whatever the depth (the
README's `--block_*_layer_start 4 --block_*_layer_end 30` on 32 layers; the script's own defaults
3 / 31 are `layer_start=3 layer_end=-1`; `layer_end=null` prunes to the last layer).
Importance: `importance` taylor (`taylor`: param_first W g, vectorize |sum W g|, param_second
W F W with F the mean squared single-sequence gradient, param_mix W g - W F W / 2), l1 / l2
(sum |W|^p, members averaged: the reference ignores `grouping_strategy` there), random (seeded
from the run's seed; the reference draws from its global generator, so the draws differ).
`grouping_strategy`: sum, mean, max, prod, first (the root: q_proj, gate_proj).
`params_removed` replaces the ratio by the fraction of the model's parameters to remove, the same
number of units from every pruned layer (`pruning.parameter_budget.uniform_counts`).
Grouped-query models (an extension: the reference's modeling is multi-head only and never
removes a key/value head with all its query heads): a unit is a key/value group; its channel
scores sum the query heads of the group position by position, and ratio mode removes
(C - int(C x (1 - ratio))) // (group x head_dim) groups (none at 0.25 on SmolLM2's groups of 3).
Gradients are float32 (a half-precision model's loss-scaled: `calibration.gradients`), so the
saliences of a float16 model are not the reference's float16 products.
Measured: with the defaults (ratio 0.25, taylor param_first, grouping sum), and with vectorize,
param_second, param_mix, l1 and l2, on SmolLM2-135M's exact multi-head rewrite (rope base set,
float32, 10 x 64 realtext tokens in one batch, every layer pruned: `layer_start=0
layer_end=null`), the same heads and channels as the official `hf_prune.py --block_wise` (run
unedited with shims) in all 30 layers, and equal weights; the default range 4 / -2 prunes the
official `--block_*_layer_start 4 --block_*_layer_end 28` layers with the same units
(results/benchmarks/official_llm_pruner.md, experiments/benchmarks/official_llm_pruner.py).
Not measured: random (different generators), grouping other than sum, grouped-query models (the
reference cannot load them). Not offered: the reference's `--iterative_steps` and
`--global_pruning`, channel-wise and layer-wise modes, and its LoRA recovery.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from prunelab.calibration.gradients import backward_through
from prunelab.calibration.hidden_states import progress_bar
from prunelab.context import PruneContext, PruneReport
from prunelab.errors import ConfigError, check_choice
from prunelab.models.adapter import ModelAdapter
from prunelab.models.width import check_width_prunable, layer_width, resize_layer
from prunelab.pruning.parameter_budget import uniform_counts
from prunelab.pruning.width import WidthAccount, check_width_settings, unit_costs
from prunelab.scoring.width import (GROUP_REDUCTIONS, TAYLOR_ORDERS, channel_importance, consecutive_sum,
                                    fold_query_heads, lowest, magnitude_importance, reduce_group,
                                    reference_pruned_channels, taylor_salience)

IMPORTANCES = ("taylor", "l1", "l2", "random")
# The members of each group in the order the reference's dependency graph lists them (its root
# first; measured on the official code: q, o, v, k and gate, up, down), which fixes the float
# rounding of their sum, with the dimension a channel's score sums over: 1 for an output row, 0 for
# an input column.
ATTENTION_MEMBERS = (("q", 1), ("o", 0), ("v", 1), ("k", 1))
MLP_MEMBERS = (("gate", 1), ("up", 1), ("down", 0))
MEMBER_KEYS = tuple(key for key, _ in ATTENTION_MEMBERS + MLP_MEMBERS)


@dataclass
class LLMPrunerPlan:
    """What `score` decided: the pruned layers, the units each loses, the unit scores."""

    account: WidthAccount
    layers: list[int]
    counts: tuple[int, int]  # (key/value groups, MLP channels) removed from each pruned layer
    attention: dict[int, torch.Tensor]  # layer -> [G] unit scores
    mlp: dict[int, torch.Tensor]  # layer -> [M] channel scores


def check_layer_settings(start: int, end: int | None) -> None:
    """`layer_start` a non-negative integer, `layer_end` an integer or null: one line otherwise
    (the bounds need the model's depth: `layer_range`)."""
    for key, value in (("layer_start", start), ("layer_end", end)):
        if (value is not None or key == "layer_start") and (isinstance(value, bool) or not isinstance(value, int)):
            raise ConfigError(f"pruning.{key} must be an integer, not {value!r}")
    if start < 0:
        raise ConfigError(f"pruning.layer_start must be 0 or more, not {start}")


def layer_range(start: int, end: int | None, num_layers: int) -> list[int]:
    """The pruned decoder layers: start .. end - 1, a negative end counted from the last layer,
    None to the last one. Out of bounds or empty is one line."""
    check_layer_settings(start, end)
    stop = num_layers if end is None else (end + num_layers if end < 0 else end)
    if not 0 <= start < num_layers or not start < stop <= num_layers:
        raise ConfigError(f"pruning.layer_start={start} / layer_end={end} select no valid layer range of a "
                          f"{num_layers}-layer model (start in 0..{num_layers - 1}, end after it, at most "
                          f"{num_layers}, negative from the last)")
    return list(range(start, stop))


def members(adapter: ModelAdapter, layer: torch.nn.Module) -> dict[str, torch.nn.Linear]:
    """q, k, v, o, gate, up, down of a resizable decoder layer."""
    arch = adapter.arch
    names = dict(zip(("q", "k", "v"), arch.attn_in)) | dict(zip(("gate", "up"), arch.mlp_in))
    names |= {"o": arch.attn_out, "down": arch.mlp_out}
    return {key: layer.get_submodule(name) for key, name in names.items()}


class LLMPruner:
    name = "llm_pruner"
    changes_shapes = True  # the efficiency evaluator measures it by default (evaluation.efficiency)
    streamable = False  # resizes the layers
    offloadable = False  # back-propagates through the whole model
    layer_gradients = True  # back-propagates: its graph and gradient sums are planned (models.memory)

    def __init__(self, ratio: float | None = None, params_removed: float | None = None, importance: str = "taylor",
                 taylor: str = "param_first", grouping_strategy: str = "sum", layer_start: int = 4,
                 layer_end: int | None = -2):
        ratio = check_width_settings(ratio, params_removed, default=0.25)  # None: the README's 0.25
        check_choice("pruning.importance", importance, IMPORTANCES)
        check_choice("pruning.taylor", taylor, TAYLOR_ORDERS)
        check_choice("pruning.grouping_strategy", grouping_strategy, GROUP_REDUCTIONS)
        if importance != "taylor" and grouping_strategy != "sum":
            raise ConfigError(f"pruning.grouping_strategy applies to importance=taylor only (the reference's "
                              f"{importance} averages a group's members), not {grouping_strategy!r}")
        check_layer_settings(layer_start, layer_end)
        self.ratio, self.params_removed, self.importance = ratio, params_removed, importance
        self.taylor, self.grouping_strategy = taylor, grouping_strategy
        self.layer_start, self.layer_end = layer_start, layer_end

    def check_model(self, adapter: ModelAdapter, name: str | None = None) -> None:
        """Refuse a model this method cannot prune, before any work, or say in one line that it
        prunes MLP channels only (`check_width_prunable`)."""
        check_width_prunable(adapter, self.name, name)

    def labels(self) -> dict[str, Any]:
        importance = f"taylor:{self.taylor}" if self.importance == "taylor" else self.importance
        return {"method": self.name, "ratio": None if self.params_removed else self.ratio,
                "params_removed": self.params_removed, "importance": importance}

    def counts(self, account: WidthAccount, layers: list[int]) -> tuple[int, int]:
        """(key/value groups, MLP channels) each pruned layer loses; one line when a layer would
        lose every head or every channel."""
        width = account.width
        if self.params_removed is None:
            channels = reference_pruned_channels(width.num_heads * width.head_dim, self.ratio)  # q_proj rows
            counts = (channels // (width.group_size * width.head_dim),
                      reference_pruned_channels(width.intermediate_size, self.ratio))
        else:
            counts = uniform_counts(account.dense_total, self.params_removed, len(layers),
                                    unit_costs(account.adapter), (width.num_kv_heads, width.intermediate_size))
        if not account.attention_prunable:  # a single key/value head per layer: it stays
            counts = (0, counts[1])
        for what, removed, total in (("attention head", counts[0], width.num_kv_heads),
                                     ("MLP channel", counts[1], width.intermediate_size)):
            if removed >= total:
                raise ConfigError(f"LLM-Pruner would remove every {what} of each pruned layer: use a smaller "
                                  "pruning.ratio or pruning.params_removed")
        return counts

    def score(self, ctx: PruneContext) -> LLMPrunerPlan:
        adapter = ctx.loaded.adapter
        account = WidthAccount(adapter, self.params_removed, self.name)  # an unsupported model fails here
        layers = layer_range(self.layer_start, self.layer_end, adapter.num_layers)
        counts = self.counts(account, layers)
        if self.importance == "taylor":
            taylor = self._taylor_importance(ctx, layers)
        generator = torch.Generator().manual_seed(ctx.seed)  # importance=random only
        attention, mlp = {}, {}
        for index in layers:
            parts = members(adapter, adapter.layers[index])
            width = layer_width(adapter, adapter.layers[index])
            if self.importance == "random":  # the reference: uniform per q_proj row, summed per unit
                rows = torch.rand(width.num_heads * width.head_dim, generator=generator)  # [H * head_dim]
                attention[index] = consecutive_sum(rows, width.group_size * width.head_dim)  # [G]
                mlp[index] = torch.rand(width.intermediate_size, generator=generator)  # [M]
                continue
            if self.importance == "taylor":
                per_member, reduction = taylor.pop(index), self.grouping_strategy
            else:
                p = 1 if self.importance == "l1" else 2
                per_member = {key: magnitude_importance(parts[key].weight.detach().float(), dim, p)
                              for key, dim in ATTENTION_MEMBERS + MLP_MEMBERS}
                reduction = "mean"  # hf_prune.py builds MagnitudeImportance with its default
            attn = [per_member[key] if key in ("k", "v") or width.group_size == 1 else
                    fold_query_heads(per_member[key], width.num_kv_heads, width.head_dim)
                    for key, _ in ATTENTION_MEMBERS]  # each [G * head_dim]
            attention[index] = consecutive_sum(reduce_group(attn, reduction), width.head_dim)  # [G]
            mlp[index] = reduce_group([per_member[key] for key, _ in MLP_MEMBERS], reduction)  # [M]
        return LLMPrunerPlan(account, layers, counts, attention, mlp)

    def _taylor_importance(self, ctx: PruneContext, layers: list[int]) -> dict[int, dict[str, torch.Tensor]]:
        """Per pruned layer, each member's channel importance ([out] for q/k/v/gate/up rows, [in]
        for o/down columns) from its salience (float32): the gradient of the mean calibration loss
        (batches weighted by their share of the sequences: one batch is the reference's one
        backward), and for param_second / param_mix first the mean squared gradient of
        one-sequence backward passes (the reference's `acc_grad`). Holds one float32 gradient
        (two for param_mix) of the pruned layers' linears."""
        adapter = ctx.loaded.adapter
        samples = ctx.calibration()  # [N, T]
        total = samples.shape[0]
        squared: dict = {}
        grads: dict = {}
        if self.taylor in ("param_second", "param_mix"):
            squared = _gradient_sums(ctx, samples, 1, layers, lambda g, share: g * g / total, "squared gradients")
        if self.taylor != "param_second":
            grads = _gradient_sums(ctx, samples, ctx.batch_size, layers,
                                   lambda g, share: g if share == 1.0 else g * share, "gradients")
        importance = {}
        for index in layers:
            parts = members(adapter, adapter.layers[index])
            grad, square = grads.pop(index, {}), squared.pop(index, {})
            importance[index] = {
                key: channel_importance(taylor_salience(parts[key].weight.detach().float(), grad.get(key),
                                                        square.get(key), self.taylor), dim, self.taylor)
                for key, dim in ATTENTION_MEMBERS + MLP_MEMBERS}
        return importance

    @torch.no_grad()
    def prune(self, ctx: PruneContext, plan: LLMPrunerPlan) -> PruneReport:
        adapter = ctx.loaded.adapter
        kept_heads = []
        for index, layer in enumerate(adapter.layers):
            width = layer_width(adapter, layer)
            if index not in plan.attention:
                kept_heads.append(list(range(width.num_kv_heads)))
                continue
            heads = _complement(lowest(plan.attention[index], plan.counts[0]), width.num_kv_heads)
            channels = _complement(lowest(plan.mlp[index], plan.counts[1]), width.intermediate_size)
            resize_layer(adapter, index, kv_heads=heads, channels=channels)
            kept_heads.append(heads.tolist())
        details = {"importance": self.importance, "taylor": self.taylor if self.importance == "taylor" else None,
                   "grouping_strategy": self.grouping_strategy, "layers": plan.layers,
                   "removed_per_layer": {"kv_heads": plan.counts[0], "channels": plan.counts[1]},
                   "width": plan.account.record(kept_heads)}
        return PruneReport(layer_targets=None, details=details)


def _gradient_sums(ctx: PruneContext, samples: torch.Tensor, batch_size: int, layers: list[int],
                   transform, desc: str) -> dict[int, dict[str, torch.Tensor]]:
    """Per pruned layer and member, the float32 sum over batches of `transform(grad, share)`:
    grad is dL_b/dW of batch b's mean loss, share = its sequences / all sequences."""
    adapter = ctx.loaded.adapter
    chosen = {id(adapter.layers[i]) for i in layers}
    sums: dict[int, dict[str, torch.Tensor]] = {}

    def weights_of(layer: torch.nn.Module) -> list[torch.Tensor]:
        parts = members(adapter, layer)
        return [parts[key].weight for key in MEMBER_KEYS] if id(layer) in chosen else []

    starts = range(0, samples.shape[0], batch_size)
    for start in progress_bar(starts, ctx.progress, f"llm_pruner: {desc}"):
        ids = samples[start:start + batch_size]  # [B, T]
        share = ids.shape[0] / samples.shape[0]

        def add(index: int, weights: list[torch.Tensor], grads: list[torch.Tensor], share: float = share) -> None:
            slot = sums.setdefault(index, {}) if weights else {}
            for key, grad in zip(MEMBER_KEYS, grads):
                value = transform(grad, share)
                slot[key] = value if key not in slot else slot[key].add_(value)

        backward_through(adapter, ids, ids.shape[0], weights_of, add, progress=False, desc="llm_pruner")
    return sums


def _complement(removed: torch.Tensor, total: int) -> torch.Tensor:
    """The sorted indices 0..total-1 not in `removed`, on the CPU on purpose: a few thousand
    indices, which `models.width.resize_layer` moves to each weight's device."""
    keep = torch.ones(total, dtype=torch.bool)
    keep[removed.cpu()] = False
    return torch.where(keep)[0]
