"""Measured sparsity and parameter counts of a (pruned) model: what the record reports as actual."""

from __future__ import annotations

import weakref
from typing import Any

import torch

from prunelab.models.adapter import ModelAdapter
from prunelab.models.offloaded_weights import has_offloaded_weights, named_weights


def zero_count(weight: torch.Tensor) -> int:
    """Zero entries of a tensor, without an 8-bytes-a-weight temporary (`(w == 0).sum()`)."""
    return weight.numel() - int(torch.count_nonzero(weight))


@torch.no_grad()
def layer_sparsity(adapter: ModelAdapter, index: int) -> float:
    """Fraction of zeros over the linears of decoder layer `index`."""
    with adapter.layer_in_memory(index) as layer:
        weights = adapter.linear_weights(layer)
        return sum(zero_count(w) for w in weights) / max(sum(w.numel() for w in weights), 1)


@torch.no_grad()
def sparsity_report(adapter: ModelAdapter, layer_targets: list[float] | None) -> dict[str, Any]:
    """Zeros per linear, per layer and overall, over the prunable linears (decoder layers only)."""
    per_linear: dict[str, float] = {}
    per_layer = []
    total_zeros = total = 0
    for index, layer in adapter.layers_in_memory():
        zeros = count = 0
        for name, linear in adapter.linears(layer).items():
            z = zero_count(linear.weight)
            per_linear[f"layers.{index}.{name}"] = z / linear.weight.numel()
            zeros += z
            count += linear.weight.numel()
        per_layer.append({"layer": index, "actual": zeros / count,
                          "target": None if layer_targets is None else layer_targets[index]})
        total_zeros += zeros
        total += count
    target = None if layer_targets is None else sum(layer_targets) / max(len(layer_targets), 1)
    return {"target": target, "overall": total_zeros / max(total, 1), "per_layer": per_layer,
            "per_linear": per_linear}


@torch.no_grad()
def parameter_counts(adapter: ModelAdapter) -> dict[str, int]:
    """Parameters and nonzero parameters of the whole model (a streamed one a layer at a time;
    weights accelerate offloaded read from where it keeps them, one at a time)."""
    if adapter.store is None and has_offloaded_weights(adapter.model):
        total = nonzero = 0
        for _, tensor in named_weights(adapter.model):  # tied weights once (named once)
            total, nonzero = total + tensor.numel(), nonzero + int(torch.count_nonzero(tensor))
        return {"total": total, "nonzero": nonzero, "decoder_layers": adapter.num_layers}
    total = nonzero = 0
    # Tied weights count once. Weak references, not ids: a streamed model frees the embeddings
    # before reading the head, and a freed tensor's id can be the next one's (counted no more).
    counted: list[weakref.ref] = []
    for part in ("embeddings", "head"):  # a streamed model reads them one at a time
        with adapter.outside_in_memory(part):  # (no reference may outlive the block: no loop variable)
            fresh = [p for p in adapter.outside_layer_parameters()
                     if not p.is_meta and not any(seen() is p for seen in counted)]
            counted.extend(weakref.ref(p) for p in fresh)
            total += sum(t.numel() for t in fresh)
            nonzero += sum(int(torch.count_nonzero(t)) for t in fresh)
            del fresh
    for _, layer in adapter.layers_in_memory():
        total += sum(p.numel() for p in layer.parameters())
        nonzero += sum(int(torch.count_nonzero(p)) for p in layer.parameters())
    return {"total": total, "nonzero": nonzero, "decoder_layers": adapter.num_layers}


def layer_parameters(adapter: ModelAdapter) -> list[int]:
    """Parameters of each decoder layer (weights, biases and norms), from their shapes."""
    return [sum(p.numel() for p in layer.parameters()) for _, layer in adapter.layers_in_memory()]
