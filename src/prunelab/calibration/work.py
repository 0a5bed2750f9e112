"""The work a pruning method does on the model, counted while it runs: tokens through decoder
layers (with and without gradients), backward calls, layers read from disk.

What a method costs is part of what it claims: WRP scores layers "forward-free" (no calibration
data, no forward pass), block influence needs one forward pass over the calibration data, SLEB
one per candidate removal, Shortened's Taylor a forward and a backward. Counting every decoder
layer's forward through a global module hook (the runner's layer calls, whole-model forwards and
streamed layers alike) gives one yardstick for all of them: forward passes over the calibration
data = tokens through decoder layers / (layers x calibration tokens). A forward made with
gradients on is one that a backward follows, so backward passes are counted the same way.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from unittest import mock

import torch
from torch import nn


@dataclass
class Work:
    layer_tokens: int = 0  # tokens through decoder layers, every call counted
    layer_tokens_with_grad: int = 0  # of those, made with gradients on (a backward follows)
    backward_calls: int = 0  # calls of torch.autograd.backward / grad

    def passes(self, layers: int, calibration_tokens: int) -> dict[str, float | int]:
        """The counts, and in passes over the calibration data through all `layers`."""
        whole = max(layers * calibration_tokens, 1)
        return {"layer_tokens": self.layer_tokens, "forward_passes": self.layer_tokens / whole,
                "backward_passes": self.layer_tokens_with_grad / whole, "backward_calls": self.backward_calls}


def _tokens(args: tuple, kwargs: dict[str, Any]) -> int:
    hidden = args[0] if args else kwargs.get("hidden_states")
    return int(hidden.shape[0] * hidden.shape[1]) if isinstance(hidden, torch.Tensor) and hidden.dim() >= 2 else 0


@contextmanager
def counting_work(layer_type: type[nn.Module]) -> Iterator[Work]:
    """Count the work done on decoder layers of `layer_type` inside the block."""
    work = Work()

    def count_forward(module: nn.Module, args: tuple, kwargs: dict[str, Any], output: Any) -> None:
        if isinstance(module, layer_type):
            tokens = _tokens(args, kwargs)
            work.layer_tokens += tokens
            if torch.is_grad_enabled():
                work.layer_tokens_with_grad += tokens

    backward, grad = torch.autograd.backward, torch.autograd.grad

    def counted_backward(*args: Any, **kwargs: Any) -> Any:
        work.backward_calls += 1
        return backward(*args, **kwargs)

    def counted_grad(*args: Any, **kwargs: Any) -> Any:
        work.backward_calls += 1
        return grad(*args, **kwargs)

    handle = nn.modules.module.register_module_forward_hook(count_forward, with_kwargs=True)
    try:
        with mock.patch.object(torch.autograd, "backward", counted_backward), \
                mock.patch.object(torch.autograd, "grad", counted_grad):
            yield work
    finally:
        handle.remove()
