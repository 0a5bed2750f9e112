"""Layer-sequential passes over the calibration set: the set-up every data-aware stage shares.

`layer_pass` captures what decoder layer 0 receives and returns the runner over the layers: Wanda
and SparseGPT propagate the pruned outputs, dense statistics and hidden states the dense ones.
`role_linears` groups a layer's linears by role; the linears of one role read the same input, so
`role_readers` hooks one of them per role. `dense_role_statistics` is the dense pass behind the
allocation policies' statistics: one input statistic per role and layer. `batch_logits` is the
forward pass of perplexity and of the calibration NLL, the same on a model in memory and a
streamed one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import torch
from torch import nn
from tqdm.auto import tqdm

from prunelab.calibration.runner import LayerSequentialRunner, Propagate, batched, capture_layer_inputs
from prunelab.calibration.statistics import InputStatistic, collect_linear_inputs
from prunelab.models.adapter import ROLES, ModelAdapter, input_device
from prunelab.models.streaming import store_of


def layer_pass(adapter: ModelAdapter, samples: torch.Tensor, batch_size: int = 1,
               propagate: Propagate = "pruned", progress: bool = True, desc: str = "layers",
               layers: Sequence[int] | None = None) -> LayerSequentialRunner:
    """The runner over the decoder layers, fed with the calibration samples ([N, T] token ids)."""
    inputs = capture_layer_inputs(adapter, samples, batch_size)
    return LayerSequentialRunner(adapter, inputs, propagate=propagate, layers=layers,
                                 progress=progress, desc=desc)


def role_linears(adapter: ModelAdapter, layer: nn.Module, roles: Sequence[str] = ROLES
                 ) -> dict[str, dict[str, nn.Linear]]:
    """role -> {name: linear} of one decoder layer, in forward order."""
    return {role: adapter.linears(layer, (role,)) for role in roles}


def role_readers(groups: dict[str, dict[str, nn.Linear]]) -> dict[str, nn.Linear]:
    """One linear per role to hook: the linears of a role read the same input."""
    return {role: next(iter(group.values())) for role, group in groups.items()}


@torch.no_grad()
def dense_role_statistics(adapter: ModelAdapter, samples: torch.Tensor,
                          make_statistic: Callable[..., InputStatistic], batch_size: int = 1,
                          progress: bool = True, desc: str = "dense statistics",
                          roles: Sequence[str] = ROLES) -> list[dict[str, InputStatistic]]:
    """Per decoder layer, one statistic per role's input, from a dense pass over the calibration
    (each layer run once: the hooked forward's outputs feed the next layer)."""
    per_layer: list[dict[str, InputStatistic]] = []
    for step in layer_pass(adapter, samples, batch_size, "dense", progress, desc):
        readers = role_readers(role_linears(adapter, step.layer, roles))
        with collect_linear_inputs(readers, make_statistic) as stats:
            step.forward()
        per_layer.append(stats)
    return per_layer


def batch_logits(model, windows: torch.Tensor, batch_size: int, progress: bool = True,
                 desc: str = "ppl") -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(batch [B, T], its logits [B, T, V]) for consecutive batches of `windows` ([n, T]).

    A model in memory runs its forward pass per batch. A streamed model (`models.streaming`)
    runs every batch through one decoder layer at a time, layers read from disk in turn, then the
    final norm and head per batch: the same operations on the same batches, so the same numbers.
    """
    device = input_device(model)
    if store_of(model) is None:
        for start in tqdm(range(0, windows.shape[0], batch_size), desc=f"{desc} windows", disable=not progress,
                          leave=False):
            batch = windows[start : start + batch_size].to(device)  # [B, T]
            yield batch, model(input_ids=batch, use_cache=False).logits
        return
    adapter = ModelAdapter(model)
    per_window = 2 * windows.shape[1] * adapter.hidden_size * 4  # input and output buffers, fp32
    group = max(1, store_of(model).activation_budget_bytes // per_window // batch_size) * batch_size
    for first in range(0, windows.shape[0], group):  # each group: one pass over the layers
        part = windows[first : first + group]
        inputs = capture_layer_inputs(adapter, part, batch_size)
        runner = LayerSequentialRunner(adapter, inputs, progress=progress, desc=f"{desc} layers")
        for _ in runner:
            pass
        with adapter.outside_in_memory("head"):  # read once for the group's logits
            for batch, hidden in zip(batched(part, batch_size), runner.outputs.hidden):  # [B, T, C]
                yield batch.to(device), adapter.logits_from_hidden(hidden)
