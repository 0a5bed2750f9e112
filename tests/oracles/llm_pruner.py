"""Oracle for LLM-Pruner's block-wise pruning of Llama models (with or without grouped-query heads).

Ma, Fang & Wang, "LLM-Pruner: On the Structural Pruning of Large Language Models", NeurIPS 2023,
written from the paper (section 3: dependency groups, the group importance of eq. 2-5 summed over
its members; block-wise: heads and MLP channels) and the repository's protocol (README LLaMA
setting: one backward of the batch's mean LM loss, param_first, grouping sum; in each pruned
layer C - int(C x (1 - ratio)) of the C rows of q_proj, floored to whole heads, and of the MLP
channels, the lowest-scoring ones). Plain loops, one unit at a time; imports nothing from prunelab.

- A head unit: a key/value head with the query heads reading it (on a multi-head model, one
  head): its rows of q_proj, k_proj, v_proj and its columns of o_proj. A channel unit: its rows of
  gate_proj and up_proj and its column of down_proj.
- taylor: a unit's score is the sum over its weights of |W dL/dW| (param_first), the mean loss
  over all calibration sequences in one batch; param_mix subtracts W^2 F / 2 before |.|, F the mean
  over sequences of the squared one-sequence gradient; param_second keeps only W^2 F; vectorize
  sums W dL/dW over each channel of a member first and takes |.| of that sum.
- l1 / l2: a unit's score is the sum of |W|^p over its weights (the repository averages its four
  members, which ranks the same).
- The pruned units are the lowest scores; they are sliced out of the weights, nothing is merged.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def _loss(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    logits = model(input_ids=ids).logits  # [B, T, V]
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(), ids[:, 1:].reshape(-1))


def _linears(layer: nn.Module) -> dict[str, nn.Linear]:
    attention, mlp = layer.self_attn, layer.mlp
    return {"q": attention.q_proj, "k": attention.k_proj, "v": attention.v_proj, "o": attention.o_proj,
            "gate": mlp.gate_proj, "up": mlp.up_proj, "down": mlp.down_proj}


def _gradients(model: nn.Module, layers: list[int], batches: list[torch.Tensor], square: bool
               ) -> list[dict[str, torch.Tensor]]:
    """Per decoder layer, each linear's gradient of the loss of each batch, summed over batches
    (squared before the sum when `square`)."""
    params = [lin.weight for i in layers for lin in _linears(model.model.layers[i]).values()]
    flags = {p: p.requires_grad for p in model.parameters()}
    for p in model.parameters():
        p.requires_grad_(False)
    for p in params:
        p.requires_grad_(True)
    sums = [{} for _ in model.model.layers]
    try:
        for ids in batches:
            with torch.enable_grad():
                grads = torch.autograd.grad(_loss(model, ids), params)
            flat = iter(grads)
            for i in layers:
                for name in _linears(model.model.layers[i]):
                    g = next(flat)
                    g = g * g if square else g
                    sums[i][name] = g if name not in sums[i] else sums[i][name] + g
    finally:
        for p, flag in flags.items():
            p.requires_grad_(flag)
    return sums


def _unit_score(parts: list[tuple[torch.Tensor, int]], vectorize: bool) -> float:
    """The score of one unit from (salience or |W|^p of one member's slice, the dimension of that
    member's channels: 0 = rows, 1 = columns); vectorize: |sum| per channel before summing."""
    total = 0.0
    for block, channel_dim in parts:
        if vectorize:
            other = 1 - channel_dim
            total += float(block.double().sum(dim=other).abs().sum())
        else:
            total += float(block.double().abs().sum())
    return total


@torch.no_grad()
def llm_pruner_oracle(model: nn.Module, token_ids: torch.Tensor, ratio: float = 0.25,
                      layers: list[int] | None = None, importance: str = "taylor",
                      taylor: str = "param_first") -> list[dict]:
    """Prune a Llama model in place; returns per pruned layer {"layer", "heads" (kept key/value
    heads), "channels" (kept MLP channels)}, sorted index lists."""
    config = model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    kv_heads = config.num_key_value_heads
    group = config.num_attention_heads // kv_heads
    layers = list(range(len(model.model.layers))) if layers is None else layers
    n = token_ids.shape[0]
    grads = squares = None
    if importance == "taylor":
        if taylor != "param_second":
            grads = _gradients(model, layers, [token_ids], square=False)
        if taylor in ("param_second", "param_mix"):
            squares = _gradients(model, layers, [token_ids[j:j + 1] for j in range(n)], square=True)
    kept = []
    for i in layers:
        lin = _linears(model.model.layers[i])
        values = {}
        for name, linear in lin.items():
            w = linear.weight.detach().float()
            if importance in ("l1", "l2"):
                values[name] = w.abs() ** (1 if importance == "l1" else 2)
            elif taylor == "param_second":
                values[name] = w * w * (squares[i][name] / n)
            elif taylor == "param_mix":
                values[name] = w * grads[i][name] - 0.5 * w * w * (squares[i][name] / n)
            else:
                values[name] = w * grads[i][name]
        vectorize = importance == "taylor" and taylor == "vectorize"
        head_scores = []
        for g in range(kv_heads):
            q_rows = slice(g * group * head_dim, (g + 1) * group * head_dim)
            kv_rows = slice(g * head_dim, (g + 1) * head_dim)
            parts = [(values["q"][q_rows], 0), (values["k"][kv_rows], 0), (values["v"][kv_rows], 0),
                     (values["o"][:, q_rows], 1)]
            head_scores.append(_unit_score(parts, vectorize))
        # every channel unit at once: its gate row, its up row, its down column, in float64
        rows = [values["gate"].double(), values["up"].double()]
        column = values["down"].double()
        if vectorize:
            channel_scores = (rows[0].sum(1).abs() + rows[1].sum(1).abs() + column.sum(0).abs()).tolist()
        else:
            channel_scores = (rows[0].abs().sum(1) + rows[1].abs().sum(1) + column.abs().sum(0)).tolist()
        q_channels = kv_heads * group * head_dim
        remove_heads = (q_channels - int(q_channels * (1 - ratio))) // (group * head_dim)
        channels = len(channel_scores)
        remove_channels = channels - int(channels * (1 - ratio))
        heads_kept = sorted(sorted(range(kv_heads), key=lambda h: head_scores[h])[remove_heads:])
        channels_kept = sorted(sorted(range(channels), key=lambda c: channel_scores[c])[remove_channels:])
        _cut(model.model.layers[i], heads_kept, channels_kept, head_dim, group)
        kept.append({"layer": i, "heads": heads_kept, "channels": channels_kept})
    return kept


def _cut(layer: nn.Module, heads: list[int], channels: list[int], head_dim: int, group: int) -> None:
    """Keep the given key/value heads (with their query heads) and MLP channels, by slicing."""
    lin = _linears(layer)
    q_rows = torch.tensor([h * group * head_dim + j for h in heads for j in range(group * head_dim)])
    kv_rows = torch.tensor([h * head_dim + j for h in heads for j in range(head_dim)])
    cols = torch.tensor(channels)
    for name, rows in (("q", q_rows), ("k", kv_rows), ("v", kv_rows)):
        lin[name].weight = nn.Parameter(lin[name].weight.data[rows])
        if lin[name].bias is not None:
            lin[name].bias = nn.Parameter(lin[name].bias.data[rows])
        lin[name].out_features = len(rows)
    lin["o"].weight = nn.Parameter(lin["o"].weight.data[:, q_rows])
    lin["o"].in_features = len(q_rows)
    for name in ("gate", "up"):
        lin[name].weight = nn.Parameter(lin[name].weight.data[cols])
        lin[name].out_features = len(cols)
    lin["down"].weight = nn.Parameter(lin["down"].weight.data[:, cols])
    lin["down"].in_features = len(cols)
