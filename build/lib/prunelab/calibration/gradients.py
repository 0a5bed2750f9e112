"""Loss gradients of chosen weights on calibration text (gradient allocation, Taylor scoring).

`squared_weight_gradients` is the pass behind gradient allocation: one sequence per backward pass,
which keeps the statistic independent of the calibration batch size. Only the weights asked for get
gradients, so the backward pass stores nothing else; every
parameter's `requires_grad` and `.grad` are restored afterwards, even when the pass fails.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm


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
    logits = model(input_ids=ids, use_cache=False).logits  # [B, T, V]
    return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten())


def squared_weight_gradients(model: nn.Module, weights: list[list[torch.Tensor]],
                             samples: torch.Tensor, progress: bool = True) -> torch.Tensor:
    """[groups] sum over sequences of the squared loss gradients of each group's weights.

    weights: one list of weight tensors per group (per decoder layer: its linears' weights);
    samples: [N, T] token ids, back-propagated one sequence at a time.
    """
    device = model.get_input_embeddings().weight.device
    total = torch.zeros(len(weights), dtype=torch.float64)  # [groups]
    with gradients_for(model, (w for group in weights for w in group)):
        for ids in tqdm(samples.split(1), desc="gradient: dense backward", disable=not progress,
                        leave=False):
            next_token_loss(model, ids.to(device)).backward()  # ids [1, T]
            for index, group in enumerate(weights):
                for w in group:
                    total[index] += float(w.grad.double().pow(2).sum())
                    w.grad = None
    return total
