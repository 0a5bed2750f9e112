"""SliceGPT's model rewrite: norms fused into the adjacent linears, residual shortcuts, rotation
and slicing of the embedding dimension.

Ashkboos, Croci, do Nascimento, Hoefler & Hensman, "SliceGPT: Compress Large Language Models by
Deleting Rows and Columns", ICLR 2024 (microsoft/TransformerCompression, `layernorm_fusion.py`,
`rotate.py`, `adapters/llama_adapter.py`), in the reference's arithmetic:
- `fuse_norms`: the head is untied from the embeddings (cloned); the embeddings have their mean
  over the hidden dimension subtracted (in float64, even for RMSNorm models, whose function then
  changes slightly: a quirk of the reference kept here); every norm's weight is multiplied into the
  columns of the linears it feeds (q/k/v, gate/up, lm_head) and the norm replaced by `ReferenceRMSNorm`,
  the reference's weightless RMSN: x / sqrt(sum(x^2) / D + 1e-5) with D the DENSE hidden size
  whatever the sliced width (an orthogonal rotation keeps the norm, so slicing only drops the
  smallest-variance directions' share), upcast only from float16;
- `shortcut_layer`: the decoder layer's class is swapped for a subclass whose residual additions
  go through `attn_shortcut_Q` ([d_in, d_mid]) and `mlp_shortcut_Q` ([d_mid, d_out]): the
  residual stream changes basis (and width) inside every layer, so the skip path needs the matrix
  Q_l^T Q_{l+1} (plain addition while a shortcut is None);
- `rotate_*` / `slice_*`: W Q on input columns, Q^T W on output rows (and biases), in float64 then
  cast back; slicing keeps the first columns / rows.
The Llama-like architectures (`Architecture.width_resizable`) are supported, except Gemma 3 (its
post-norms sit between o_proj / down_proj and the residual, so the rotation cannot be fused there); the head is never
sliced (the reference's default), so the last layer's MLP writes the full hidden size.

A sliced model is described on its config, so that a checkpoint saved with `save_pretrained`
rebuilds (`apply_slicing` on a model built from that config, then the state dict loads):
`config.prunelab_slicing` = {"dense_hidden_size": D, "norm_eps": 1e-5, "embedding_dim": d_0,
"layers": [{"attn_in": d, "attn_out": d, "mlp_out": d}, ...]}, `config.tie_word_embeddings` False.
`config.hidden_size` keeps the dense value (the head and rotary settings read it).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from prunelab.errors import ConfigError, UnsupportedModelError
from prunelab.models.adapter import ModelAdapter
from prunelab.models.architectures import ARCHITECTURES
from prunelab.models.width import model_name, supported_architectures

SLICING_KEY = "prunelab_slicing"
NORM_EPS = 1e-5  # the reference's RMSN constant (not the config's rms_norm_eps)


class ReferenceRMSNorm(nn.Module):
    """SliceGPT's RMSN (`slicegpt/modules.py`): no weight (fused away), the sum of squares divided
    by the dense hidden size `mean_dim` even on a sliced input."""

    def __init__(self, mean_dim: int, eps: float = NORM_EPS):
        super().__init__()
        self.eps = eps
        self.mean_dim = mean_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        input_dtype = x.dtype
        if x.dtype == torch.float16:
            x = x.to(torch.float32)
        variance = x.pow(2).sum(-1, keepdim=True) / self.mean_dim  # [..., 1]
        x = x * torch.rsqrt(variance + self.eps)
        return x.to(input_dtype)


class _ShortcutForward:
    """Decoder-layer forward with SliceGPT's shortcut matrices (the reference's
    CompressedLlamaDecoderLayer, on transformers 5's Llama-like layer)."""

    _prunelab_paths: tuple[str, str, str, str]  # attention norm, attention, MLP norm, MLP

    def forward(self, hidden_states: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        attn_norm, attention, mlp_norm, mlp = (self.get_submodule(p) for p in self._prunelab_paths)
        residual = hidden_states  # [B, T, d_in]
        hidden_states, _ = attention(hidden_states=attn_norm(hidden_states), **kwargs)  # [B, T, d_mid]
        shortcut = self.attn_shortcut_Q
        hidden_states = (residual if shortcut is None else torch.matmul(residual, shortcut)) + hidden_states
        residual = hidden_states
        hidden_states = mlp(mlp_norm(hidden_states))  # [B, T, d_out]
        shortcut = self.mlp_shortcut_Q
        return (residual if shortcut is None else torch.matmul(residual, shortcut)) + hidden_states


_CLASSES: dict[type, type] = {}


def sliceable_architectures() -> list[str]:
    """Llama-like layers whose residual stream is written by o_proj / down_proj directly and whose
    norms scale by their weight (so it can be fused into the next linears)."""
    return [name for name in supported_architectures()
            if not (ARCHITECTURES[name].attn_post_norm or ARCHITECTURES[name].mlp_post_norm
                    or ARCHITECTURES[name].norm_offset)]


def check_sliceable(adapter: ModelAdapter, name: str | None = None) -> None:
    """One line when SliceGPT cannot rewrite this model (before any weight is touched)."""
    arch = adapter.arch
    if arch.attn_post_norm or arch.mlp_post_norm:
        raise UnsupportedModelError(
            f"slicegpt cannot prune {model_name(adapter, name)}: its post-norms between o_proj/down_proj and "
            f"the residual stream block the rotation of the residual (Q^T cannot be fused into o_proj and "
            f"down_proj through a norm); supported: {', '.join(sliceable_architectures())}")
    if not arch.width_resizable or adapter.parallel_residual or arch.norm_offset:
        raise UnsupportedModelError(f"SliceGPT cannot rewrite {arch.name} layers here; supported: "
                                    f"{', '.join(sliceable_architectures())}")
    if adapter.streamed:
        raise ConfigError("SliceGPT rewrites every layer and the embeddings, which a streamed model "
                          "(model.streaming) cannot write back yet: use model.streaming=false")
    if getattr(adapter.config, SLICING_KEY, None) or getattr(adapter.config, "prunelab_layer_shapes", None):
        raise ConfigError("SliceGPT starts from a dense model (this one was already width-pruned or sliced)")


def shortcut_layer(adapter: ModelAdapter, layer: nn.Module) -> None:
    """Give a decoder layer the shortcut forward, its two shortcuts None (plain residual)."""
    base = type(layer)
    if isinstance(layer, _ShortcutForward):
        return
    if base not in _CLASSES:
        _CLASSES[base] = type(f"Sliced{base.__name__}", (_ShortcutForward, base), {})
    layer.__class__ = _CLASSES[base]
    arch = adapter.arch
    layer._prunelab_paths = (arch.attn_norm, arch.attention, arch.mlp_norm, arch.mlp_out.rpartition(".")[0])
    layer.attn_shortcut_Q = None
    layer.mlp_shortcut_Q = None


def set_shortcut(layer: nn.Module, name: str, value: torch.Tensor) -> None:
    """Store `attn_shortcut_Q` or `mlp_shortcut_Q` as a parameter (saved with the state dict)."""
    setattr(layer, name, nn.Parameter(value, requires_grad=False))


def _replace(root: nn.Module, path: str, module: nn.Module) -> None:
    parent, _, attr = path.rpartition(".")
    setattr(root.get_submodule(parent) if parent else root, attr, module)


def _untie_head(adapter: ModelAdapter) -> nn.Linear:
    head = adapter.lm_head
    head.weight = nn.Parameter(head.weight.data.clone(), requires_grad=False)
    adapter.config.tie_word_embeddings = False
    text_config = getattr(adapter.config, "get_text_config", None)
    if text_config is not None:
        text_config().tie_word_embeddings = False
    return head


def _embeddings(adapter: ModelAdapter) -> list[nn.Embedding]:
    return [adapter.model.get_submodule(path) for path in adapter.arch.embeddings]


def _fuse_into(norm: nn.Module, linears: list[nn.Linear]) -> None:
    """W * norm.weight, column-wise, in float64 (`fuse_ln_linear`; Llama norms have no bias)."""
    for linear in linears:
        dtype = linear.weight.dtype
        linear.weight.data = (linear.weight.data.double() * norm.weight.double()).to(dtype)  # [out, in]


@torch.no_grad()
def fuse_norms(adapter: ModelAdapter) -> None:
    """The reference's `fuse_modules`: untie the head, subtract the embeddings' mean, fuse every
    norm's weight into the linears it feeds and replace the norms by `ReferenceRMSNorm`."""
    arch, hidden = adapter.arch, adapter.hidden_size
    head = _untie_head(adapter)
    for embedding in _embeddings(adapter):
        W = embedding.weight.data.double()  # [V, D]
        embedding.weight.data = (W - W.mean(dim=-1, keepdim=True)).to(embedding.weight.dtype)
    for layer in adapter.layers:
        attn_norm, mlp_norm = adapter.norms(layer)
        _fuse_into(attn_norm, list(adapter.linears(layer, ("attn_in",)).values()))
        _fuse_into(mlp_norm, list(adapter.linears(layer, ("mlp_in",)).values()))
        _replace(layer, arch.attn_norm, ReferenceRMSNorm(hidden))
        _replace(layer, arch.mlp_norm, ReferenceRMSNorm(hidden))
    _fuse_into(adapter.final_norm, [head])
    _replace(adapter.model, arch.final_norm, ReferenceRMSNorm(hidden))


def _numel(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def slicing_parameter_change(adapter: ModelAdapter, dim: int) -> int:
    """Parameters SliceGPT adds (positive) or removes (negative) when it keeps `dim` of the dense
    hidden size, from the dense model's shapes alone (no weight is read or changed):
    the norms' weights go (fused), a tied head is untied (its weights counted a second time), the
    embeddings, q/k/v and gate/up lose columns, o_proj and down_proj (except the last layer's) lose
    rows, and every layer gains its two shortcut matrices (d x d, the last one's d x D)."""
    hidden, n = adapter.hidden_size, adapter.num_layers
    cut = hidden - dim
    head, embeddings = adapter.lm_head, _embeddings(adapter)
    change = head.weight.numel() if any(head.weight is e.weight for e in embeddings) else 0
    change -= _numel(adapter.final_norm) + sum(e.num_embeddings * cut for e in embeddings)
    for index, layer in enumerate(adapter.layers):
        last = index == n - 1
        change -= sum(_numel(norm) for norm in adapter.norms(layer))
        change -= sum(linear.out_features * cut for linear in attention_inputs(adapter, layer) + mlp_inputs(adapter, layer))
        for writer in adapter.residual_writers(layer)[:1 if last else 2]:
            change -= (writer.in_features + (writer.bias is not None)) * cut
        change += dim * dim + dim * (hidden if last else dim)
    return change


def rotate_inputs(linears: list[nn.Linear], Q: torch.Tensor) -> None:
    """W <- W Q ([out, in] @ [in, in]) in float64."""
    for linear in linears:
        dtype = linear.weight.dtype
        linear.weight.data = torch.matmul(linear.weight.data.double(), Q.to(linear.weight.device)).to(dtype)


def rotate_output(linear: nn.Linear, Q: torch.Tensor) -> None:
    """W <- Q^T W, b <- Q^T b ([out, out] @ [out, in]) in float64."""
    dtype = linear.weight.dtype
    Q = Q.to(linear.weight.device)
    linear.weight.data = torch.matmul(Q.T, linear.weight.data.double()).to(dtype)
    if linear.bias is not None:
        linear.bias.data = torch.matmul(Q.T, linear.bias.data.double()).to(dtype)


def slice_inputs(linears: list[nn.Linear], dim: int) -> None:
    """Keep the first `dim` input columns."""
    for linear in linears:
        linear.weight.data = linear.weight.data[:, :dim]
        linear.in_features = dim


def slice_output(linear: nn.Linear, dim: int) -> None:
    """Keep the first `dim` output rows (and bias entries)."""
    linear.weight.data = linear.weight.data[:dim, :]
    if linear.bias is not None:
        linear.bias.data = linear.bias.data[:dim]
    linear.out_features = dim


@torch.no_grad()
def rotate_and_slice_embeddings(adapter: ModelAdapter, Q: torch.Tensor, dim: int) -> None:
    for embedding in _embeddings(adapter):
        dtype = embedding.weight.dtype
        W = torch.matmul(embedding.weight.data.double(), Q.to(embedding.weight.device))  # [V, D]
        embedding.weight.data = W.to(dtype)[:, :dim]
        embedding.embedding_dim = dim


def attention_inputs(adapter: ModelAdapter, layer: nn.Module) -> list[nn.Linear]:
    return list(adapter.linears(layer, ("attn_in",)).values())


def mlp_inputs(adapter: ModelAdapter, layer: nn.Module) -> list[nn.Linear]:
    return list(adapter.linears(layer, ("mlp_in",)).values())


def slicing_description(adapter: ModelAdapter) -> dict[str, Any]:
    """What `config.prunelab_slicing` stores, read from the modules' shapes."""
    layers = []
    for layer in adapter.layers:
        attn_out, mlp_out = adapter.residual_writers(layer)
        layers.append({"attn_in": attention_inputs(adapter, layer)[0].in_features,
                       "attn_out": attn_out.out_features, "mlp_out": mlp_out.out_features})
    return {"dense_hidden_size": adapter.hidden_size, "norm_eps": NORM_EPS,
            "embedding_dim": _embeddings(adapter)[0].embedding_dim, "layers": layers}


def record_slicing(adapter: ModelAdapter) -> None:
    setattr(adapter.config, SLICING_KEY, slicing_description(adapter))


def _placeholder(like: torch.Tensor, shape: tuple[int, ...]) -> nn.Parameter:
    return nn.Parameter(torch.empty(shape, dtype=like.dtype, device=like.device), requires_grad=False)


@torch.no_grad()
def apply_slicing(adapter: ModelAdapter) -> bool:
    """Rewrite a model built from a sliced checkpoint's config (dense shapes) to the stored
    description: reference norms, shortcut layers, sliced linears and embeddings, an untied head,
    with placeholder weights until the state dict is loaded. False when the config has none."""
    spec = getattr(adapter.config, SLICING_KEY, None)
    if not spec:
        return False
    if len(spec["layers"]) != adapter.num_layers:
        raise ValueError(f"config.{SLICING_KEY} describes {len(spec['layers'])} layers, the model has "
                         f"{adapter.num_layers}")
    arch, hidden = adapter.arch, spec["dense_hidden_size"]
    head = adapter.lm_head
    head.weight = _placeholder(head.weight, tuple(head.weight.shape))  # untied
    for embedding in _embeddings(adapter):
        embedding.weight = _placeholder(embedding.weight, (embedding.weight.shape[0], spec["embedding_dim"]))
        embedding.embedding_dim = spec["embedding_dim"]
    _replace(adapter.model, arch.final_norm, ReferenceRMSNorm(hidden, spec["norm_eps"]))
    for layer, dims in zip(adapter.layers, spec["layers"]):
        _replace(layer, arch.attn_norm, ReferenceRMSNorm(hidden, spec["norm_eps"]))
        _replace(layer, arch.mlp_norm, ReferenceRMSNorm(hidden, spec["norm_eps"]))
        attn_out, mlp_out = adapter.residual_writers(layer)
        for linear, rows, columns in ([(lin, None, dims["attn_in"]) for lin in attention_inputs(adapter, layer)]
                                      + [(lin, None, dims["attn_out"]) for lin in mlp_inputs(adapter, layer)]
                                      + [(attn_out, dims["attn_out"], None), (mlp_out, dims["mlp_out"], None)]):
            out, inp = linear.weight.shape
            linear.weight = _placeholder(linear.weight, (rows or out, columns or inp))
            if linear.bias is not None and rows:
                linear.bias = _placeholder(linear.bias, (rows,))
            linear.out_features, linear.in_features = rows or out, columns or inp
        shortcut_layer(adapter, layer)
        like = attn_out.weight
        set_shortcut(layer, "attn_shortcut_Q", torch.empty(dims["attn_in"], dims["attn_out"],
                                                           dtype=like.dtype, device=like.device))
        set_shortcut(layer, "mlp_shortcut_Q", torch.empty(dims["attn_out"], dims["mlp_out"],
                                                          dtype=like.dtype, device=like.device))
    return True
