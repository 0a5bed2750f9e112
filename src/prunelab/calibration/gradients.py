"""Loss gradients of chosen weights on calibration text (gradient allocation, Taylor scoring).

`squared_weight_gradients` is the pass behind gradient allocation: one sequence per backward pass,
which keeps the statistic independent of the calibration batch size. Only the weights asked for get
gradients, so the backward pass stores nothing else; every
parameter's `requires_grad` and `.grad` are restored afterwards, even when the pass fails.

A streamed model (`models.streaming`) cannot hold the whole graph: `backward_by_layer` runs the
forward pass one decoder layer at a time keeping every layer's input (h_0..h_L, spilled to disk
beyond the activation budget), takes dL/dh_L at the head, then visits the layers last to first,
each read once: it recomputes the layer's forward from its stored input with grad on, and
back-propagates dL/dh_{l+1} into the layer's weights and dL/dh_l. Per layer these are the
operations of the whole-model backward on the same tensors, so the gradients are the same.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from prunelab.calibration.runner import batched, capture_layer_inputs, move_to
from prunelab.models.adapter import ModelAdapter


@contextmanager
def gradients_for(model: nn.Module, weights: Iterable[torch.Tensor]) -> Iterator[None]:
    """Inside, only `weights` require grad (with grad mode on); on exit every parameter's flag is
    restored and every gradient cleared."""
    saved = {p: p.requires_grad for p in model.parameters()}
    weights = list(weights)
    try:
        for p in model.parameters():
            p.requires_grad_(False)
        for w in weights:
            w.requires_grad_(True)
            w.grad = None
        with torch.enable_grad():
            yield
    finally:
        for p, flag in saved.items():
            p.requires_grad_(flag)
            p.grad = None


def next_token_loss(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy of ids [B, T] (the calibration LM loss), computed in fp32."""
    return loss_from_logits(model(input_ids=ids, use_cache=False).logits, ids)


def loss_from_logits(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy in fp32 of logits [B, T, V] for ids [B, T]."""
    return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten().to(logits.device))


def squared_weight_gradients(adapter: ModelAdapter, samples: torch.Tensor, progress: bool = True) -> torch.Tensor:
    """[L] sum over sequences of the squared loss gradients of each decoder layer's linear weights.

    samples: [N, T] token ids, back-propagated one sequence at a time.
    """
    total = torch.zeros(adapter.num_layers, dtype=torch.float64)  # [L]

    def add(index: int, group: list[torch.Tensor]) -> None:
        for w in group:
            total[index] += float(w.grad.double().pow(2).sum())

    if adapter.streamed:  # one backward per sequence and layer: the same sums in the same order
        backward_by_layer(adapter, samples, 1, adapter.linear_weights, add, per_batch=True, progress=progress,
                          desc="gradient: streamed backward")
        return total
    model = adapter.model
    weights = [adapter.linear_weights(layer) for layer in adapter.layers]
    device = model.get_input_embeddings().weight.device
    with gradients_for(model, (w for group in weights for w in group)):
        for ids in tqdm(samples.split(1), desc="gradient: dense backward", disable=not progress,
                        leave=False):
            next_token_loss(model, ids.to(device)).backward()  # ids [1, T]
            for index, group in enumerate(weights):
                add(index, group)
                for w in group:
                    w.grad = None
    return total


def backward_by_layer(adapter: ModelAdapter, samples: torch.Tensor, batch_size: int,
                      weights_of: Callable[[nn.Module], list[torch.Tensor]],
                      visit: Callable[[int, list[torch.Tensor]], None], per_batch: bool = False,
                      progress: bool = True, desc: str = "streamed backward") -> None:
    """The calibration LM loss back-propagated through a streamed model, one layer in memory.

    samples: [N, T] token ids in batches of `batch_size`. For each decoder layer (last to first),
    `weights_of(layer)` names the weights that get gradients, and `visit(index, weights)` reads
    their `.grad`: after each batch's backward (`per_batch`, the gradients then cleared) or once,
    summed over the batches in order (as `.grad` accumulates in a whole-model loop).
    Memory: the L + 1 layer inputs and two sets of dL/dh, all batches (the store spills them to
    disk beyond its activation budget), one layer's weights and gradients, one batch's graph.
    """
    store = adapter.store
    inputs = capture_layer_inputs(adapter, samples, batch_size)
    state_bytes = sum(h.numel() * h.element_size() for h in inputs.hidden)
    with store.spilling_beyond_budget((adapter.num_layers + 3) * state_bytes):
        keep = store.keep_activation
        kwargs = [move_to(kw, store.device) for kw in inputs.kwargs]
        states = [inputs.hidden]  # states[l][b]: h_l of batch b, [B, T, C]
        with torch.no_grad():
            for _, layer in tqdm(adapter.layers_in_memory(), total=adapter.num_layers, desc=f"{desc}: forward",
                                 disable=not progress, leave=False):
                states.append([keep(adapter.call_layer(layer, h.to(store.device), kw))
                               for h, kw in zip(states[-1], kwargs)])
        grads = []  # dL/dh_{l+1} of each batch, [B, T, C]
        with torch.enable_grad(), adapter.outside_in_memory("head"):
            for h, ids in zip(states.pop(), batched(samples, batch_size)):
                h = h.detach().to(store.device).requires_grad_()
                loss_from_logits(adapter.logits_from_hidden(h), ids).backward()
                grads.append(keep(h.grad))
        for index in tqdm(reversed(range(adapter.num_layers)), total=adapter.num_layers,
                          desc=f"{desc}: backward", disable=not progress, leave=False):
            with adapter.layer_in_memory(index) as layer:
                weights = weights_of(layer)
                with gradients_for(layer, weights):
                    below = []
                    for h, kw, grad in zip(states.pop(), kwargs, grads):
                        h = h.detach().to(store.device).requires_grad_(index > 0)  # dL/dh_0 unused
                        adapter.call_layer(layer, h, kw).backward(grad.to(store.device))
                        if index > 0:
                            below.append(keep(h.grad))
                        if per_batch:
                            visit(index, weights)
                            for w in weights:
                                w.grad = None
                    if not per_batch:
                        visit(index, weights)
                grads = below
