"""Physical width resizing: keep a subset of a decoder layer's attention heads and MLP channels.

The Linear modules are cut, not masked, so the model is smaller and faster. Units, on the
architectures with separate q/k/v and gate/up/down projections (`Architecture.width_resizable`:
llama, mistral, qwen2, qwen3, gemma3_text; Gemma 3's q/k norms act per head on head_dim, which never
changes, and a compensation bias on o_proj / down_proj sits before its post-norms, on the output it
compensates):
- an attention unit is a key/value head with all the query heads that read it (under grouped-query
  attention a query head cannot leave its group; on a multi-head model the unit is one head): its
  rows of q_proj, k_proj, v_proj (and their biases) and its columns of o_proj;
- an MLP unit is a channel: its rows of gate_proj and up_proj and its column of down_proj.
A compensation bias (FLAP's) can be added to o_proj and down_proj. A layer may not lose every head
or every channel (transformers cannot run an attention with no head); on a model with a single
key/value head per layer (Gemma-3-270M) no attention unit can go, so the methods prune MLP channels
only and their records say so (`attention_prunable`).

transformers 5's Llama-like attention reads the number of heads from the projections' shapes
(`view(..., -1, head_dim)`) and repeats key/value heads `num_key_value_groups` times: cutting whole
groups leaves that ratio unchanged, so forward, the KV cache and `generate` work as before.

What the shapes are is stored on the config, so a checkpoint saved with `save_pretrained` can be
rebuilt (`apply_layer_shapes` on a model built from that config, then load the state dict):
`config.prunelab_layer_shapes` is a list with one dict per decoder layer,
    {"num_attention_heads": int, "num_key_value_heads": int, "intermediate_size": int,
     "attn_out_bias": bool, "mlp_out_bias": bool}
(`attn_out_bias`/`mlp_out_bias`: whether o_proj / down_proj has a bias; q/k/v biases follow the
architecture's config as usual). The config's own `num_attention_heads`, `num_key_value_heads`
and `intermediate_size` keep the dense model's values; `head_dim` and `hidden_size` never change.

`to_multi_head` rewrites a grouped-query model as the equivalent multi-head one (each key/value
head repeated for its query heads): the same logits, and a model the multi-head-only official
width-pruning code (FLAP) accepts.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from prunelab.errors import ConfigError, UnsupportedModelError
from prunelab.models.adapter import ModelAdapter
from prunelab.models.architectures import ARCHITECTURES

log = logging.getLogger(__name__)

SHAPES_KEY = "prunelab_layer_shapes"


@dataclass(frozen=True)
class LayerWidth:
    """The width of one decoder layer's attention and MLP."""

    num_heads: int  # query heads
    num_kv_heads: int
    head_dim: int
    intermediate_size: int

    @property
    def group_size(self) -> int:
        """Query heads per key/value head."""
        return self.num_heads // self.num_kv_heads


def supported_architectures() -> list[str]:
    return sorted(name for name, arch in ARCHITECTURES.items() if arch.width_resizable)


def check_resizable(adapter: ModelAdapter) -> None:
    """One line naming the supported architectures when this one's layers cannot be resized."""
    if not adapter.arch.width_resizable:
        raise UnsupportedModelError(
            f"width pruning cannot resize {adapter.arch.name} layers (fused or differently shaped "
            f"projections); supported: {', '.join(supported_architectures())}")
    if adapter.streamed:
        raise ConfigError("width pruning resizes layers, which a streamed model (model.streaming) "
                          "cannot write back yet: use model.streaming=false")


def model_name(adapter: ModelAdapter, name: str | None = None) -> str:
    """How a refusal names the model: the run's label when given, with the architecture."""
    return f"{name} ({adapter.arch.name})" if name and name != adapter.arch.name else adapter.arch.name


def attention_prunable(adapter: ModelAdapter) -> bool:
    """False when a layer has a single key/value head: the smallest attention unit is a key/value
    head with all its query heads and a layer must keep one, so no attention unit can be removed
    and a width method prunes MLP channels only (Gemma-3-270M: 4 query heads share 1 key/value head)."""
    return min(layer_width(adapter, layer).num_kv_heads for layer in adapter.layers) > 1


def check_width_prunable(adapter: ModelAdapter, method: str = "width pruning", name: str | None = None) -> None:
    """`check_resizable`, and one warning line when a layer has a single key/value head: then the
    method prunes MLP channels only (`attention_prunable`), and the record's `width.attention` says so."""
    check_resizable(adapter)
    if not attention_prunable(adapter):
        log.warning("%s on %s: its layers have a single key/value head (the smallest attention unit, and a "
                    "layer must keep one), so attention is kept whole and only MLP channels are pruned",
                    method, model_name(adapter, name))


def _parts(adapter: ModelAdapter, layer: nn.Module) -> tuple[nn.Module, list[nn.Linear], nn.Linear,
                                                            list[nn.Linear], nn.Linear]:
    """(attention module, [q, k, v], o, [gate, up], down) of a resizable layer."""
    arch = adapter.arch
    attention = layer.get_submodule(arch.attention)
    qkv = [layer.get_submodule(name) for name in arch.attn_in]
    mlp_in = [layer.get_submodule(name) for name in arch.mlp_in]
    return attention, qkv, layer.get_submodule(arch.attn_out), mlp_in, layer.get_submodule(arch.mlp_out)


def layer_width(adapter: ModelAdapter, layer: nn.Module) -> LayerWidth:
    """The current width of a layer, read from its modules' shapes."""
    attention, (q, k, _), _, (gate, _), _ = _parts(adapter, layer)
    head_dim = attention.head_dim
    return LayerWidth(q.out_features // head_dim, k.out_features // head_dim, head_dim, gate.out_features)


def _keep_rows(linear: nn.Linear, rows: torch.Tensor) -> None:
    """Keep the given output rows (weight and bias) of a linear, in place."""
    linear.weight = nn.Parameter(linear.weight.data.index_select(0, rows.to(linear.weight.device)),
                                 requires_grad=linear.weight.requires_grad)
    if linear.bias is not None:
        linear.bias = nn.Parameter(linear.bias.data.index_select(0, rows.to(linear.bias.device)),
                                   requires_grad=linear.bias.requires_grad)
    linear.out_features = int(rows.numel())


def _keep_columns(linear: nn.Linear, columns: torch.Tensor) -> None:
    """Keep the given input columns of a linear, in place."""
    linear.weight = nn.Parameter(linear.weight.data.index_select(1, columns.to(linear.weight.device)),
                                 requires_grad=linear.weight.requires_grad)
    linear.in_features = int(columns.numel())


def add_bias(linear: nn.Linear, bias: torch.Tensor) -> None:
    """Add `bias` ([out]) to a linear's output: a new bias parameter if it had none."""
    bias = bias.to(device=linear.weight.device, dtype=linear.weight.dtype)
    if linear.bias is None:
        linear.bias = nn.Parameter(bias.clone(), requires_grad=linear.weight.requires_grad)
    else:
        linear.bias.data += bias


def _unit_rows(units: torch.Tensor, size: int) -> torch.Tensor:
    """Row indices of the kept units, each `size` consecutive rows: [len(units) * size]."""
    return (units.view(-1, 1) * size + torch.arange(size, device=units.device).view(1, -1)).reshape(-1)


def _check_indices(what: str, index: int, kept: torch.Tensor, total: int) -> torch.Tensor:
    kept = torch.as_tensor(kept, dtype=torch.long).flatten().unique(sorted=True)
    if kept.numel() == 0:
        raise ConfigError(f"layer {index} would keep no {what}: a decoder layer needs at least one")
    if int(kept[0]) < 0 or int(kept[-1]) >= total:
        raise ValueError(f"layer {index}: {what} indices out of range 0..{total - 1}")
    return kept


@torch.no_grad()
def resize_layer(adapter: ModelAdapter, index: int, kv_heads: Sequence[int] | torch.Tensor | None = None,
                 channels: Sequence[int] | torch.Tensor | None = None,
                 attn_out_bias: torch.Tensor | None = None, mlp_out_bias: torch.Tensor | None = None) -> None:
    """Keep the key/value heads `kv_heads` (each with its query heads) and the MLP `channels` of
    decoder layer `index`; None keeps all. `attn_out_bias` / `mlp_out_bias` ([hidden]) are added to
    o_proj / down_proj. Updates `config.prunelab_layer_shapes`."""
    check_resizable(adapter)
    layer = adapter.layers[index]
    width = layer_width(adapter, layer)
    attention, (q, k, v), o, mlp_in, down = _parts(adapter, layer)
    if kv_heads is not None:
        groups = _check_indices("attention head", index, kv_heads, width.num_kv_heads)
        query_rows = _unit_rows(groups, width.group_size * width.head_dim)  # [kept q heads * head_dim]
        kv_rows = _unit_rows(groups, width.head_dim)  # [kept kv heads * head_dim]
        _keep_rows(q, query_rows)
        _keep_rows(k, kv_rows)
        _keep_rows(v, kv_rows)
        _keep_columns(o, query_rows)
        attention.num_key_value_groups = width.group_size  # unchanged: whole groups go
    if channels is not None:
        kept = _check_indices("MLP channel", index, channels, width.intermediate_size)
        for linear in mlp_in:
            _keep_rows(linear, kept)
        _keep_columns(down, kept)
        mlp = adapter.layers[index].get_submodule(adapter.arch.mlp_out.rpartition(".")[0])
        if hasattr(mlp, "intermediate_size"):
            mlp.intermediate_size = int(kept.numel())
    if attn_out_bias is not None:
        add_bias(o, attn_out_bias)
    if mlp_out_bias is not None:
        add_bias(down, mlp_out_bias)
    record_layer_shapes(adapter)


def layer_shapes(adapter: ModelAdapter) -> list[dict]:
    """The per-layer description stored as `config.prunelab_layer_shapes` (see the module doc)."""
    shapes = []
    for layer in adapter.layers:
        width = layer_width(adapter, layer)
        _, _, o, _, down = _parts(adapter, layer)
        shapes.append({"num_attention_heads": width.num_heads, "num_key_value_heads": width.num_kv_heads,
                       "intermediate_size": width.intermediate_size,
                       "attn_out_bias": o.bias is not None, "mlp_out_bias": down.bias is not None})
    return shapes


def record_layer_shapes(adapter: ModelAdapter) -> None:
    setattr(adapter.config, SHAPES_KEY, layer_shapes(adapter))


@torch.no_grad()
def apply_layer_shapes(adapter: ModelAdapter) -> bool:
    """Resize a model built from a width-pruned checkpoint's config (dense shapes) to the shapes in
    `config.prunelab_layer_shapes`, so that the checkpoint's state dict loads into it. The weights
    kept are placeholders (the first units) until the state dict is loaded. False when the config
    has no stored shapes (nothing to do)."""
    shapes = getattr(adapter.config, SHAPES_KEY, None)
    if not shapes:
        return False
    if len(shapes) != adapter.num_layers:
        raise ValueError(f"config.{SHAPES_KEY} describes {len(shapes)} layers, the model has "
                         f"{adapter.num_layers}")
    for index, shape in enumerate(shapes):
        width = layer_width(adapter, adapter.layers[index])
        if shape["num_attention_heads"] * width.num_kv_heads != shape["num_key_value_heads"] * width.num_heads:
            raise ValueError(f"layer {index}: {shape['num_attention_heads']} query heads over "
                             f"{shape['num_key_value_heads']} key/value heads is not the model's grouping")
        hidden = adapter.hidden_size
        zeros = adapter.layers[index].get_submodule(adapter.arch.attn_out).weight.new_zeros(hidden)
        resize_layer(adapter, index, kv_heads=torch.arange(shape["num_key_value_heads"]),
                     channels=torch.arange(shape["intermediate_size"]),
                     attn_out_bias=zeros if shape["attn_out_bias"] else None,
                     mlp_out_bias=zeros if shape["mlp_out_bias"] else None)
    return True


@torch.no_grad()
def to_multi_head(adapter: ModelAdapter) -> None:
    """Rewrite a grouped-query model in place as its exact multi-head equivalent: every key/value
    head's rows of k_proj and v_proj (and biases) repeated for each of its query heads, in the
    order transformers' `repeat_kv` uses, `num_key_value_groups` = 1 and
    `config.num_key_value_heads` = `config.num_attention_heads`. The logits are identical."""
    check_resizable(adapter)
    for layer in adapter.layers:
        width = layer_width(adapter, layer)
        attention, (_, k, v), _, _, _ = _parts(adapter, layer)
        if width.group_size == 1:
            continue
        rows = torch.arange(width.num_kv_heads).repeat_interleave(width.group_size)  # [num_heads]
        rows = _unit_rows(rows, width.head_dim)  # [num_heads * head_dim]
        _keep_rows(k, rows)
        _keep_rows(v, rows)
        attention.num_key_value_groups = 1
    adapter.config.num_key_value_heads = adapter.config.num_attention_heads
    if getattr(adapter.config, SHAPES_KEY, None):
        record_layer_shapes(adapter)
