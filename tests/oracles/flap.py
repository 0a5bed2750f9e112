"""Oracle for FLAP and its structured baselines (Wanda-sp, magnitude-sp), multi-head Llama models.

An, Zhao, Yu, Tang & Wang, "Fluctuation-based Adaptive Structured Pruning for Large Language
Models", AAAI 2024 (CASIA-IVA-Lab/FLAP, `lib/prune.py`), written from the paper and the
repository's protocol as plain loops; imports nothing from prunelab.

- FLAP (published setting: WIFV, AL-AM, bias): one pass over the dense model, one sample per
  forward; per input column j of o_proj and down_proj a running mean m_j and fluctuation f_j of the
  input (the repository's update: the first sample seeds the mean, the "old" mean of the Welford
  step is the already-updated one, f *= (n-1)/n then += sum_t (x_tj - m_j)^2 / (n+1)); metric
  f_j * sum_i W_ij^2, squared for attention; per layer standardised (unbiased std), attention
  averaged per head; one descending sort of all heads and channels, a head costing int(512/3)
  channels; the cut where the cumulative cost is nearest (1 - ratio) x the total; keep scores
  above the cut's. Bias of o_proj / down_proj: (float16(m) on the removed columns) @ W^T.
- Wanda-sp: layer by layer, pruned outputs fed forward; column score mean_i |W_ij| ||X_j||, heads
  by the sum of their columns; keep scores >= the int(ratio x n)-th smallest.
- magnitude-sp: column L2 norms, the same per-layer rule, no data.
Heads are removed by slicing q/k/v rows and o_proj columns (the model must be multi-head:
`multi_head_rewrite` makes one from a grouped-query model), channels by slicing gate/up rows and
down_proj columns.
"""

from __future__ import annotations

import torch
from torch import nn

from oracles.llama_layers import capture_layer0_inputs, run_layer


@torch.no_grad()
def multi_head_rewrite(model: nn.Module) -> None:
    """Repeat every key/value head's rows of k_proj and v_proj for each of its query heads."""
    config = model.config
    head_dim = config.hidden_size // config.num_attention_heads
    repeats = config.num_attention_heads // config.num_key_value_heads
    for layer in model.model.layers:
        attention = layer.self_attn
        for linear in (attention.k_proj, attention.v_proj):
            weight = linear.weight.data.reshape(config.num_key_value_heads, head_dim, -1)
            weight = weight.repeat_interleave(repeats, dim=0).reshape(-1, weight.shape[-1])
            linear.weight = nn.Parameter(weight)
            linear.out_features = weight.shape[0]
        attention.num_key_value_groups = 1
    config.num_key_value_heads = config.num_attention_heads


def _columns(heads: torch.Tensor, head_dim: int) -> torch.Tensor:
    return (heads.view(-1, 1) * head_dim + torch.arange(head_dim)).reshape(-1)


@torch.no_grad()
def cut(layer: nn.Module, heads: torch.Tensor, channels: torch.Tensor, head_dim: int,
        o_bias: torch.Tensor | None = None, down_bias: torch.Tensor | None = None) -> None:
    """Keep the given heads and channels of a (multi-head) Llama decoder layer."""
    attention, mlp = layer.self_attn, layer.mlp
    rows = _columns(heads, head_dim)
    for linear in (attention.q_proj, attention.k_proj, attention.v_proj):
        linear.weight = nn.Parameter(linear.weight.data[rows])
        linear.out_features = rows.numel()
    attention.o_proj.weight = nn.Parameter(attention.o_proj.weight.data[:, rows])
    attention.o_proj.in_features = rows.numel()
    for linear in (mlp.gate_proj, mlp.up_proj):
        linear.weight = nn.Parameter(linear.weight.data[channels])
        linear.out_features = channels.numel()
    mlp.down_proj.weight = nn.Parameter(mlp.down_proj.weight.data[:, channels])
    mlp.down_proj.in_features = channels.numel()
    if o_bias is not None:
        attention.o_proj.bias = nn.Parameter(o_bias)
    if down_bias is not None:
        mlp.down_proj.bias = nn.Parameter(down_bias)


class Fluctuation:
    """The repository's running mean and fluctuation of one linear's input columns."""

    def __init__(self, columns: int):
        self.mean = torch.zeros(columns)  # [in], float32
        self.fluctuation = torch.zeros(columns)
        self.samples = 0

    def add(self, inp: torch.Tensor) -> None:
        x = inp.reshape(-1, inp.shape[-1]).t()  # [in, tokens], one sample
        n = self.samples
        self.mean *= n / (n + 1)
        self.mean += torch.mean(x, dim=1) / (n + 1)
        if n >= 1:
            self.fluctuation *= (n - 1) / n
            deviation = x - self.mean.unsqueeze(1)  # from the already-updated mean (the quirk)
            self.fluctuation += torch.sum(deviation * deviation, dim=1) / (n + 1)
        self.samples = n + 1


def _hooked(layer: nn.Module, inputs, kwargs, make):
    """Run every sample through the layer with `make(columns)` statistics on o_proj's and
    down_proj's inputs; returns (their statistics, the layer's outputs)."""
    stats = {"o": make(layer.self_attn.o_proj.in_features), "down": make(layer.mlp.down_proj.in_features)}
    handles = [layer.self_attn.o_proj.register_forward_hook(lambda m, a, o: stats["o"].add(a[0])),
               layer.mlp.down_proj.register_forward_hook(lambda m, a, o: stats["down"].add(a[0]))]
    try:
        outputs = [run_layer(layer, hidden, kw) for hidden, kw in zip(inputs, kwargs)]
    finally:
        for handle in handles:
            handle.remove()
    return stats, outputs


def _standardised(x: torch.Tensor) -> torch.Tensor:
    return (x - x.mean(dim=1, keepdim=True)) / x.std(dim=1, keepdim=True)


@torch.no_grad()
def flap_oracle(model: nn.Module, token_ids: torch.Tensor, ratio: float = 0.2) -> list[dict]:
    """Prune a multi-head Llama model in place as FLAP's published setting does; returns per layer
    {"heads", "channels"} kept (sorted index lists)."""
    head_dim = model.config.hidden_size // model.config.num_attention_heads
    inputs, kwargs = capture_layer0_inputs(model, token_ids)
    attn_metrics, mlp_metrics, attn_means, mlp_means = [], [], [], []
    for layer in model.model.layers:
        stats, inputs = _hooked(layer, inputs, kwargs, Fluctuation)
        o_weight, down_weight = layer.self_attn.o_proj.weight.data, layer.mlp.down_proj.weight.data
        attn_metrics.append((stats["o"].fluctuation * o_weight.pow(2).sum(dim=0)) ** 2)
        mlp_metrics.append(stats["down"].fluctuation * down_weight.pow(2).sum(dim=0))
        attn_means.append(stats["o"].mean.half())
        mlp_means.append(stats["down"].mean.half())
    num_layers = len(attn_metrics)
    attn = _standardised(torch.stack(attn_metrics)).reshape(num_layers, -1, head_dim).mean(dim=2)  # [L, H]
    mlp = _standardised(torch.stack(mlp_metrics))  # [L, M]
    everything = torch.cat([attn.flatten(), mlp.flatten()])
    ordered, order = torch.sort(everything, descending=True)
    cost = torch.where(order < attn.numel(), int(512 / 3), 1)  # int64
    kept_cost = torch.cumsum(cost, 0)
    cut_at = torch.argmin(torch.abs(kept_cost - cost.sum() * (1 - ratio)))
    threshold = ordered[cut_at]
    kept = []
    for index, layer in enumerate(model.model.layers):
        heads = torch.nonzero(attn[index] > threshold).flatten()
        channels = torch.nonzero(mlp[index] > threshold).flatten()
        o_weight, down_weight = layer.self_attn.o_proj.weight.data, layer.mlp.down_proj.weight.data
        removed_columns = torch.ones(o_weight.shape[1], dtype=torch.bool)
        removed_columns[_columns(heads, head_dim)] = False
        removed_channels = torch.ones(down_weight.shape[1], dtype=torch.bool)
        removed_channels[channels] = False
        o_bias = (attn_means[index] * removed_columns).to(o_weight.dtype) @ o_weight.T
        down_bias = (mlp_means[index] * removed_channels).to(down_weight.dtype) @ down_weight.T
        cut(layer, heads, channels, head_dim, o_bias, down_bias)
        kept.append({"heads": heads.tolist(), "channels": channels.tolist()})
    return kept


class SquaredNorm:
    """Wanda's running mean over samples of each input column's squared L2 norm."""

    def __init__(self, columns: int):
        self.value = torch.zeros(columns)
        self.samples = 0

    def add(self, inp: torch.Tensor) -> None:
        x = inp.reshape(-1, inp.shape[-1]).t().float()  # [in, tokens]
        self.value *= self.samples / (self.samples + 1)
        self.samples += 1
        self.value += torch.norm(x, p=2, dim=1) ** 2 / self.samples


def _uniform(scores: torch.Tensor, remove: int) -> torch.Tensor:
    return torch.nonzero(scores >= torch.sort(scores).values[remove]).flatten()


@torch.no_grad()
def structured_baseline_oracle(model: nn.Module, token_ids: torch.Tensor | None, method: str,
                               ratio: float = 0.2) -> list[dict]:
    """Wanda-sp (`method="wanda_sp"`, layer by layer) or magnitude-sp (`"magnitude_sp"`, no data)."""
    head_dim = model.config.hidden_size // model.config.num_attention_heads
    inputs, kwargs = capture_layer0_inputs(model, token_ids) if method == "wanda_sp" else (None, None)
    kept = []
    for layer in model.model.layers:
        o_weight, down_weight = layer.self_attn.o_proj.weight.data, layer.mlp.down_proj.weight.data
        if method == "wanda_sp":
            stats, _ = _hooked(layer, inputs, kwargs, SquaredNorm)
            attn_columns = (o_weight.abs() * stats["o"].value.sqrt()).mean(dim=0)
            mlp_columns = (down_weight.abs() * stats["down"].value.sqrt()).mean(dim=0)
        else:
            attn_columns, mlp_columns = o_weight.norm(dim=0), down_weight.norm(dim=0)
        head_scores = attn_columns.reshape(-1, head_dim).sum(dim=1)
        heads = _uniform(head_scores, int(ratio * head_scores.numel()))
        channels = _uniform(mlp_columns, int(mlp_columns.numel() * ratio))
        cut(layer, heads, channels, head_dim)
        if method == "wanda_sp":
            inputs = [run_layer(layer, hidden, kw) for hidden, kw in zip(inputs, kwargs)]
        kept.append({"heads": heads.tolist(), "channels": channels.tolist()})
    return kept
