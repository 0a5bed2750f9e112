"""The weights of a model a user loaded with `device_map="auto"` that accelerate keeps on the CPU or
on disk: read and changed as if they were resident.

With a `max_memory` smaller than the model, accelerate leaves the offloaded weights on the `meta`
device outside their module's forward pass: its `AlignDevicesHook` moves them in from the hook's
`weights_map` and out again around each call. A pruning pass that reads a weight, changes it and
runs the layer again would read `meta`, or see its change undone by the next call. `onloaded` keeps
a module's weights in memory across any number of calls (statistics, pruning, the pruned layer's
outputs) and writes what changed back to the `weights_map`, so a pruned weight is what every later
forward reads; `named_weights` reads every weight, offloaded or not, one at a time (checks, counts).

Changed weights are kept in host memory (accelerate reads its loader's state dict before its files,
and the user's checkpoint is never written): a model larger than the host is for `model.streaming`,
which writes changed layers back to shards of its own.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn


def _offload_hook(module: nn.Module):
    """The module's accelerate hook if it keeps the module's weights offloaded, else None."""
    hook = getattr(module, "_hf_hook", None)
    return hook if getattr(hook, "offload", False) and getattr(hook, "weights_map", None) is not None else None


def offloaded_modules(model: nn.Module) -> list[nn.Module]:
    """The modules (in `model`, itself included) whose weights accelerate keeps offloaded."""
    return [module for module in model.modules() if _offload_hook(module) is not None]


def has_offloaded_weights(model: nn.Module) -> bool:
    return any(_offload_hook(module) is not None for module in model.modules())


def _hooked_tensors(module: nn.Module, hook) -> list[str]:
    """Names (relative to `module`) of the tensors `hook` moves in and out."""
    from accelerate.utils import named_module_tensors

    return [name for name, _ in named_module_tensors(module, include_buffers=hook.offload_buffers,
                                                     recurse=hook.place_submodules, remove_non_persistent=True)]


def named_weights(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) of every parameter, an offloaded one read from accelerate's `weights_map`
    (one at a time: a disk-offloaded model is never all in memory)."""
    offloaded = {}
    for prefix, module in model.named_modules():
        hook = _offload_hook(module)
        if hook is not None:
            for name in _hooked_tensors(module, hook):
                offloaded[f"{prefix}.{name}" if prefix else name] = (hook, name)
    for name, tensor in model.named_parameters():
        if tensor.is_meta and name in offloaded:
            hook, key = offloaded[name]
            yield name, hook.weights_map[key]
        else:
            yield name, tensor


@contextmanager
def onloaded(module: nn.Module) -> Iterator[nn.Module]:
    """`module` with every offloaded weight in it in memory (on its hook's execution device) for
    the duration, across any number of forward calls; on exit the weights that changed are written
    back to their `weights_map` and all go back to `meta`."""
    hooked = [(part, _offload_hook(part)) for part in module.modules() if _offload_hook(part) is not None]
    loaded = []
    try:
        for part, hook in hooked:
            hook.pre_forward(part)  # accelerate's own onloading
            hook.offload = False  # calls inside neither reload (undoing changes) nor offload
            loaded.append((part, hook, {name: _tensor(part, name).detach().clone()
                                        for name in _hooked_tensors(part, hook)}))
        yield module
    finally:
        for part, hook, before in loaded:
            for name, original in before.items():
                now = _tensor(part, name)
                if not now.is_meta and not torch.equal(now.detach().to(original.device), original):
                    _write_back(hook.weights_map, name, now.detach().to("cpu", copy=True))
            hook.offload = True
            hook.post_forward(part, None)  # accelerate's own offloading (to meta)


def _tensor(module: nn.Module, name: str) -> torch.Tensor:
    owner, _, attr = name.rpartition(".")
    return getattr(module.get_submodule(owner) if owner else module, attr)


def _write_back(weights_map, name: str, value: torch.Tensor) -> None:
    """`value` becomes what accelerate reads for `name`: in a disk-backed loader, its in-memory
    state dict (read before its files); in a plain dict, the entry itself."""
    from accelerate.utils import OffloadedWeightsLoader, PrefixedDataset

    key, dataset = name, weights_map
    if isinstance(weights_map, PrefixedDataset):
        key, dataset = f"{weights_map.prefix}{name}", weights_map.dataset
    if isinstance(dataset, OffloadedWeightsLoader):
        dataset.state_dict[key] = value
    else:
        dataset[key] = value
