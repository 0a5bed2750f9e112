"""What the width-pruning methods (FLAP, Wanda-sp, magnitude-sp) share: their settings' checks, the
parameter cost of a unit, the per-layer structure of a budget, and the record of what was removed.

The choice of units is the methods' (scores in `scoring.width`); cutting them out of the modules is
`models.width`'s. A record's `pruning.width` holds per layer the kept key/value heads, query heads
and MLP channels and the parameters before and after, and in total the parameters before and
after, the fraction removed and, with `params_removed`, the target, and under `attention` whether
attention units could go (not with a single key/value head per layer: MLP channels only).
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from prunelab.context import PruneContext
from prunelab.errors import ConfigError
from prunelab.models.adapter import ModelAdapter
from prunelab.models.width import (attention_prunable, check_resizable, check_width_prunable, layer_width,
                                   resize_layer)
from prunelab.pruning.parameter_budget import TOLERANCE, check_fraction, removed_fraction, uniform_counts
from prunelab.pruning.report import layer_parameters, parameter_counts
from prunelab.scoring.width import per_unit, uniform_keep

log = logging.getLogger(__name__)


def check_width_settings(ratio: float | None, params_removed: float | None, default: float = 0.2,
                         key: str = "pruning.ratio") -> float | None:
    """The ratio the method uses: the references' `ratio` in (0, 1) (`default` when None), or None
    when a parameter budget `params_removed` in (0, 1) replaces it. Both given is one line (the
    budget used to win silently); a ratio left at None means "the reference's default"."""
    check_fraction(params_removed)
    if params_removed is not None:
        if ratio is not None:
            raise ConfigError(f"{key}={ratio!r} and pruning.params_removed={params_removed!r} both set the amount "
                              f"to prune: set one (the other null)")
        return None
    ratio = default if ratio is None else ratio
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 < ratio < 1:
        raise ConfigError(f"{key} must be in (0, 1), not {ratio!r}")
    return ratio


def unit_costs(adapter: ModelAdapter, bias: bool = False) -> tuple[int, int]:
    """Parameters of (one attention unit: a key/value head with its query heads, one MLP channel)
    in the first decoder layer, biases of the input projections included."""
    layer = adapter.layers[0]
    width = layer_width(adapter, layer)
    linears = adapter.linears(layer)
    hidden = adapter.hidden_size
    per_row = {name: lin.in_features + (lin.bias is not None) for name, lin in linears.items()}
    q, k, v = adapter.arch.attn_in
    attn = (width.group_size * per_row[q] + per_row[k] + per_row[v]) * width.head_dim
    attn += width.group_size * width.head_dim * hidden  # o_proj columns
    mlp = sum(per_row[name] for name in adapter.arch.mlp_in) + hidden  # gate/up rows, down column
    return attn, mlp


class WidthAccount:
    """Parameters of the model before pruning, and the record once it is pruned."""

    def __init__(self, adapter: ModelAdapter, params_removed: float | None, method: str = "width pruning"):
        check_resizable(adapter)
        self.adapter = adapter
        self.attention_prunable = attention_prunable(adapter)
        self.target = params_removed
        self.dense_total = parameter_counts(adapter)["total"]
        self.dense_layers = layer_parameters(adapter)
        widths = [layer_width(adapter, layer) for layer in adapter.layers]
        if len({(w.num_heads, w.num_kv_heads, w.intermediate_size) for w in widths}) > 1:
            raise ConfigError("width pruning starts from a model whose layers all have the same width "
                              "(this one was already width-pruned)")
        self.width = widths[0]

    def uniform_counts(self, ratio: float, added: int = 0) -> tuple[int, int]:
        """(key/value heads, MLP channels) to remove from every layer: the references' int(ratio x n)
        of each, or, with a parameter budget, `parameter_budget.uniform_counts`."""
        units = (self.width.num_kv_heads, self.width.intermediate_size)  # a single kv head: none can go
        if self.target is None:
            return int(ratio * units[0]), int(units[1] * ratio)
        return uniform_counts(self.dense_total, self.target, self.adapter.num_layers, unit_costs(self.adapter),
                              units, added)

    def record(self, kept_kv_heads: list[list[int]]) -> dict[str, Any]:
        """The record's `width` section, measured on the pruned model."""
        adapter = self.adapter
        after = layer_parameters(adapter)
        pruned_total = parameter_counts(adapter)["total"]
        per_layer = []
        for index, layer in enumerate(adapter.layers):
            width = layer_width(adapter, layer)
            per_layer.append({"layer": index, "kv_heads": kept_kv_heads[index], "num_heads": width.num_heads,
                              "num_kv_heads": width.num_kv_heads, "intermediate_size": width.intermediate_size,
                              "parameters_before": self.dense_layers[index], "parameters_after": after[index]})
        achieved = removed_fraction(self.dense_total, pruned_total)
        if self.target is not None and abs(achieved - self.target) > TOLERANCE:
            log.warning("width pruning removed %.4f of the parameters, target %.4f", achieved, self.target)
        log.info("width pruning: %d -> %d parameters (%.2f%% removed)", self.dense_total, pruned_total,
                 100 * achieved)
        return {"parameters_before": self.dense_total, "parameters_after": pruned_total,
                "params_removed_target": self.target, "params_removed": achieved,
                "attention": "pruned" if self.attention_prunable else
                             "kept whole: a single key/value head per layer, MLP channels only",
                "dense_width": {"num_heads": self.width.num_heads, "num_kv_heads": self.width.num_kv_heads,
                                "head_dim": self.width.head_dim,
                                "intermediate_size": self.width.intermediate_size},
                "per_layer": per_layer}


def prune_layer_uniformly(adapter: ModelAdapter, index: int, attn_columns: torch.Tensor,
                          mlp_columns: torch.Tensor, counts: tuple[int, int]) -> list[int]:
    """The references' per-layer selection and cut: attention units scored by the sum of their
    o_proj input columns' scores ([H * head_dim]), MLP channels by theirs ([M]), `counts` =
    (units, channels) removed by `uniform_keep`. Returns the kept key/value heads."""
    width = layer_width(adapter, adapter.layers[index])
    heads = uniform_keep(per_unit(attn_columns, width.group_size * width.head_dim), counts[0])  # [G]
    channels = uniform_keep(mlp_columns, counts[1])  # [M]
    kept = torch.where(heads)[0]
    resize_layer(adapter, index, kv_heads=kept, channels=torch.where(channels)[0])
    return kept.tolist()


class UniformWidthPruning:
    """What the per-layer structured baselines (Wanda-sp, magnitude-sp) share: the reference's
    ratio or a parameter budget, their labels, and the plan made before any weight changes (the
    dense model's parameters and the (heads, channels) every layer loses)."""

    name = "uniform_width"
    changes_shapes = True  # the efficiency evaluator measures it by default (evaluation.efficiency)
    streamable = False

    def __init__(self, ratio: float | None = None, params_removed: float | None = None):
        self.ratio = check_width_settings(ratio, params_removed)  # None (the reference's 0.2) or a budget
        self.params_removed = params_removed

    def labels(self) -> dict[str, Any]:
        return {"method": self.name, "ratio": None if self.params_removed else self.ratio,
                "params_removed": self.params_removed}

    def check_model(self, adapter: ModelAdapter, name: str | None = None) -> None:
        """Refuse a model these methods cannot prune, before any work, or say in one line that they
        prune MLP channels only (`check_width_prunable`)."""
        check_width_prunable(adapter, self.name, name)

    def score(self, ctx: PruneContext) -> tuple[WidthAccount, tuple[int, int]]:
        """The plan; the scores themselves are computed per layer in `prune` (Wanda-sp's depend on
        the already-pruned earlier layers)."""
        account = WidthAccount(ctx.loaded.adapter, self.params_removed, self.name)  # an unsupported model fails here
        return account, account.uniform_counts(self.ratio)
