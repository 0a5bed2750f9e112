"""What a model costs to run, counted rather than timed: parameters, the bytes of its weights as
saved, FLOPs of a real forward, and the KV cache a token leaves behind.

FLOPs come from PyTorch's own counter (`torch.utils.flop_counter.FlopCounterMode`) on a real
forward of the model as it is, so removed layers, resized modules and recovery operators (a
Ghosted d x d matmul at each boundary) are counted as they run, and masked weights are counted as
the dense kernels run them: an unstructured mask saves no FLOP without a sparse kernel. The KV
cache is measured on the cache object a forward returns, not derived from the config.
"""

from __future__ import annotations

import inspect
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from prunelab.errors import ConfigError


@dataclass(frozen=True)
class CountedCost:
    """One model's counted cost; `flops_*` for batch 1 at `context` tokens."""

    parameters: int
    nonzero_parameters: int
    weight_bytes: int
    flops_prefill: int  # a forward over `context` tokens
    flops_decode: int  # one new token after a cache of `context` tokens
    kv_bytes_per_token: int
    context: int

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


def unique_parameters(model: nn.Module) -> list[torch.Tensor]:
    """Each parameter once (tied input and output embeddings share one tensor)."""
    seen, unique = set(), []
    for parameter in model.parameters():
        key = (parameter.data_ptr(), parameter.shape, parameter.device) if parameter.device.type != "meta" \
            else id(parameter)
        if key not in seen:
            seen.add(key)
            unique.append(parameter)
    return unique


def parameter_bytes(model: nn.Module) -> tuple[int, int, int]:
    """(parameters, non-zero parameters, bytes of the weights as saved): every tensor once, at its
    own dtype. A weight on the meta device (offloaded) counts its size and all its entries."""
    total = nonzero = size = 0
    for parameter in unique_parameters(model):
        total += parameter.numel()
        size += parameter.numel() * parameter.element_size()
        nonzero += parameter.numel() if parameter.device.type == "meta" else int(torch.count_nonzero(parameter))
    return total, nonzero, size


def cache_keyword(model: nn.Module) -> str:
    """The forward keyword of the KV cache: `cache` in newer transformers, `past_key_values` before."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def returned_cache(output: Any) -> Any:
    """The KV cache a forward returned (`cache` or `past_key_values`)."""
    cache = getattr(output, "cache", None)
    return cache if cache is not None else getattr(output, "past_key_values", None)


def tensor_bytes(obj: Any, seen: set[int] | None = None) -> int:
    """Bytes of every tensor reachable from a cache object (lists, tuples, dicts, attributes)."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return 0
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(tensor_bytes(v, seen) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(v, seen) for v in obj)
    if hasattr(obj, "__dict__") and not isinstance(obj, (nn.Module, type)):
        return sum(tensor_bytes(v, seen) for v in vars(obj).values())
    return 0


def token_ids(model: nn.Module, batch: int, length: int, seed: int = 0) -> torch.Tensor:
    """Fixed random token ids [batch, length] on the model's input device: speed and FLOPs do not
    depend on which tokens, and every model of a comparison gets the same ones."""
    generator = torch.Generator().manual_seed(seed)
    vocab = model.get_input_embeddings().num_embeddings
    device = model.get_input_embeddings().weight.device
    ids = torch.randint(0, vocab, (batch, length), generator=generator)  # [B, T] on the CPU: seeded
    return ids.to(device if device.type != "meta" else "cpu")


def _counted_flops(run) -> int:
    counter = FlopCounterMode(display=False)
    with counter:
        run()
    return int(counter.get_total_flops())


@torch.inference_mode()
def count_cost(model: nn.Module, context: int) -> CountedCost:
    """Parameters, weight bytes, FLOPs of a prefill of `context` tokens and of one decode step
    after it, and KV-cache bytes per token, on the model as it is (batch 1)."""
    parameters, nonzero, size = parameter_bytes(model)
    ids = token_ids(model, 1, context)  # [1, L]
    keyword = cache_keyword(model)
    try:
        flops_prefill = _counted_flops(lambda: model(ids, use_cache=False))
        output = model(ids, use_cache=True)
        cache = returned_cache(output)
        step = ids[:, -1:]  # [1, 1]
        flops_decode = _counted_flops(lambda: model(step, use_cache=True, **{keyword: cache}))
    except Exception as err:  # a model the counter (or its cache) cannot follow
        raise ConfigError(f"the FLOP counter cannot follow this model ({type(err).__name__}: "
                          f"{str(err).splitlines()[0] if str(err) else ''}); use evaluation.efficiency.measure=never") from None
    if flops_prefill <= 0 or flops_decode <= 0:
        raise ConfigError("the FLOP counter saw no matmul in this model's forward (custom kernels?); "
                          "use evaluation.efficiency.measure=never")
    kv_bytes = tensor_bytes(returned_cache(model(ids, use_cache=True)))
    return CountedCost(parameters, nonzero, size, flops_prefill, flops_decode, kv_bytes // context, context)
