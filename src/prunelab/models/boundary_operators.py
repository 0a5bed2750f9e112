"""Operators on the residual stream attached to a model, and how they survive a save and reload.

Depth-pruning recoveries (LinearPatch, Ghosted) rebuild the dense model's state at a removal
boundary with x <- x W (fp32, cast back) applied at the input of a module of the pruned model: a
decoder layer, or the final norm (site `final_norm`). The operators live in a submodule
`prunelab_boundary_ops` of the model (so parameter counts and `.to()` see them), applied by one
forward pre-hook per hooked module.

`save_recovered` writes the checkpoint without them plus `prunelab_boundary_ops.safetensors` and
`prunelab_boundary_ops.json` (site and kind of each); `load_model` calls
`apply_saved_boundary_operators(model, directory)` to re-attach them after `from_pretrained`. This
module sits in `models/` because loading needs it; fitting the operators is `recovery/`'s job.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from prunelab.models.adapter import ModelAdapter, input_device
from prunelab.models.safetensors_files import read_header

ATTR = "prunelab_boundary_ops"
WEIGHTS_FILE = "prunelab_boundary_ops.safetensors"
INDEX_FILE = "prunelab_boundary_ops.json"
FINAL_NORM = "final_norm"

log = logging.getLogger(__name__)


class BoundaryOperator(nn.Module):
    """x <- x W (kind "matrix", W [C, C]) or x <- x * w (kind "diagonal", w [C]), computed in fp32."""

    def __init__(self, weight: torch.Tensor, kind: str, method: str = ""):
        super().__init__()
        if kind not in ("matrix", "diagonal"):
            raise ValueError(f"kind must be matrix or diagonal, not {kind!r}")
        self.weight = nn.Parameter(weight.detach().float().clone(), requires_grad=False)  # [C, C] or [C]
        self.kind = kind
        self.method = method

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [..., C]
        w = self.weight.to(device=x.device, dtype=torch.float32)
        y = x.float() @ w if self.kind == "matrix" else x.float() * w  # [..., C]
        return y.to(x.dtype)


class BoundaryOperators(nn.Module):
    """Every operator of a model with its site; one pre-hook per hooked module applies them in order."""

    def __init__(self) -> None:
        super().__init__()
        self.ops = nn.ModuleList()
        self.targets: list[nn.Module] = []  # hooked module of each op (not registered: plain list)
        self._hooked: dict[int, Any] = {}

    def add(self, target: nn.Module, op: BoundaryOperator) -> None:
        self.ops.append(op)
        self.targets.append(target)
        if id(target) not in self._hooked:
            hook = self._hook(target)
            self._hooked[id(target)] = target.register_forward_pre_hook(hook, with_kwargs=True)

    def _hook(self, target: nn.Module) -> Callable:
        def hook(_module: nn.Module, args: tuple, kwargs: dict):
            ops = [op for op, t in zip(self.ops, self.targets) if t is target]
            if args:
                x = args[0]
                for op in ops:
                    x = op(x)
                return (x, *args[1:]), kwargs
            x = kwargs["hidden_states"]
            for op in ops:
                x = op(x)
            return args, {**kwargs, "hidden_states": x}
        return hook

    def remove(self) -> None:
        for handle in self._hooked.values():
            handle.remove()
        self._hooked.clear()


def site_module(adapter: ModelAdapter, site: int | str) -> nn.Module:
    return adapter.final_norm if site == FINAL_NORM else adapter.layers[int(site)]


def attach(model: nn.Module, site: int | str, op: BoundaryOperator,
           adapter: ModelAdapter | None = None) -> None:
    """Apply `op` at `site` of the (pruned) model from now on; operators at one site run in order."""
    adapter = adapter or ModelAdapter(model)
    container = getattr(model, ATTR, None)
    if container is None:
        container = BoundaryOperators()
        setattr(model, ATTR, container)
    container.add(site_module(adapter, site), op)


def save_recovered(model: nn.Module, directory: str | Path,
                   save_weights: Callable[[Path], Any] | None = None, **save_kwargs: Any) -> None:
    """save_pretrained without the operators, then the operators beside the checkpoint.
    `save_weights(directory)` replaces save_pretrained (a streamed model's `save_checkpoint`)."""
    directory = Path(directory)
    container = getattr(model, ATTR, None)
    if container is not None:
        del model._modules[ATTR]
    try:
        if save_weights is not None:
            save_weights(directory)
        else:
            model.save_pretrained(directory, **{"safe_serialization": True, **save_kwargs})
    finally:
        if container is not None:
            model._modules[ATTR] = container
    if container is None or not len(container.ops):
        return
    adapter = ModelAdapter(model)
    index, tensors = [], {}
    for k, (op, target) in enumerate(zip(container.ops, container.targets)):
        if target is adapter.final_norm:
            site: int | str = FINAL_NORM
        else:
            site = next(i for i, layer in enumerate(adapter.layers) if layer is target)
        tensors[f"op{k}"] = op.weight.detach().float().cpu().contiguous()
        index.append({"tensor": f"op{k}", "site": site, "kind": op.kind, "method": op.method})
    save_file(tensors, str(directory / WEIGHTS_FILE))
    (directory / INDEX_FILE).write_text(json.dumps({"format": 1, "operators": index}, indent=1))


def _has_unsaved_operators(directory: Path) -> bool:
    """True when a checkpoint's own weight files contain operator tensors (plain save_pretrained)."""
    if not directory.is_dir():
        return False
    for path in directory.glob("*.safetensors"):  # headers only: no memory map of the shards
        if path.name != WEIGHTS_FILE and any(key.startswith(ATTR + ".") for key in read_header(path)):
            return True
    return False


def has_operators(model: nn.Module) -> bool:
    container = getattr(model, ATTR, None)
    return container is not None and len(container.ops) > 0


def apply_saved_boundary_operators(model: nn.Module, directory: str | Path) -> int:
    """Re-attach the operators saved by `save_recovered`; returns how many (0 if none saved)."""
    directory = Path(directory)
    if not (directory / INDEX_FILE).is_file():
        if _has_unsaved_operators(directory):
            log.warning("%s holds boundary operators inside the model weights (saved with plain "
                        "save_pretrained): they were NOT re-attached; save with "
                        "prunelab.models.boundary_operators.save_recovered", directory)
        return 0
    index = json.loads((directory / INDEX_FILE).read_text())["operators"]
    tensors = load_file(str(directory / WEIGHTS_FILE))
    adapter = ModelAdapter(model)
    device = input_device(model)
    for entry in index:
        op = BoundaryOperator(tensors[entry["tensor"]], entry["kind"], entry.get("method", "")).to(device)
        attach(model, entry["site"], op, adapter)
    return len(index)
