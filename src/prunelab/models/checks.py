"""Checks on a model before any work is spent on it, each failing in one `ModelCheckError` line.

- `guarded(what, source, call)`: hub offline, corrupt safetensors, a bad tokenizer path become one
  line naming the model and the cause.
- `check_memory`: the parameter count of the config (built on the meta device, no memory used)
  times the dtype's size, against the free memory of the device; refused instead of being killed
  by the out-of-memory killer.
- `check_loaded_weights`: every weight the config expects came from the checkpoint and the
  checkpoint has none the config does not know (a config missing `num_hidden_layers` would
  otherwise add randomly initialised layers).
- `check_finite`: no NaN or Inf weight.
"""

from __future__ import annotations

import logging
import os
import platform
from pathlib import Path
from collections.abc import Callable
from typing import Any

import torch

from prunelab.errors import ModelCheckError, PrunelabError

log = logging.getLogger(__name__)

#: Free memory must exceed the weights' size by this factor (activations, buffers, copies).
MEMORY_MARGIN = 1.2
SKIP_MEMORY_CHECK = "PRUNELAB_SKIP_MEMORY_CHECK"
#: Boundary operators saved inside the weights: `apply_saved_boundary_operators` warns about them.
TOLERATED_PREFIXES = ("prunelab_boundary_ops.",)
GIB = 1024**3


def guarded(what: str, source: str, call: Callable[[], Any]) -> Any:
    """call(), with any loading failure turned into one line: `cannot load <what> from <source>`.
    transformers' own load report is silenced: `check_loaded_weights` says the same in one line."""
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        return call()
    except PrunelabError:
        raise
    except Exception as err:
        first = next((line.strip() for line in str(err).splitlines() if line.strip()), type(err).__name__)
        offline = any(w in str(err) for w in ("offline", "couldn't connect", "Connection", "resolve"))
        hint = "; offline? set HF_HUB_OFFLINE=1 with a cached model, or give a local path" if offline else ""
        raise ModelCheckError(f"cannot load {what} from {source}: {first[:300]}{hint}") from None
    finally:
        hf_logging.set_verbosity(verbosity)


def parameter_count(config) -> int:
    """Parameters the config defines, counted on the meta device (no memory is allocated)."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


def cpu_model() -> str:
    """The CPU's model name (Linux /proc/cpuinfo), else what `platform` reports."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cuda_memory_cap(device: torch.device) -> int | None:
    """Bytes this process may hold on a CUDA device when it has capped its allocator
    (`torch.cuda.set_per_process_memory_fraction`: the fraction times the device's memory), else
    None. The cap is the process's own limit, which `mem_get_info` (the whole device's free memory)
    does not see: a plan against the device alone would run into the allocator's out-of-memory error."""
    try:
        index = torch.cuda.current_device() if device.index is None else device.index  # "cuda" has none
        fraction = torch.cuda.get_per_process_memory_fraction(index)  # not in every torch
        if not 0.0 < fraction < 1.0:  # 1.0: no cap set
            return None
        return int(fraction * torch.cuda.mem_get_info(index)[1])
    except Exception:  # an older torch, or no CUDA: no cap can be told
        return None


def free_bytes(device: torch.device) -> int | None:
    """Free memory of the device in bytes, or None when it cannot be told. On a GPU, the device's
    free memory or, under this process's allocator cap (`cuda_memory_cap`), what the cap leaves
    beside the memory the allocator holds, whichever is less."""
    if device.type == "cuda":
        free = torch.cuda.mem_get_info(device)[0]
        cap = cuda_memory_cap(device)
        return free if cap is None else max(0, min(free, cap - torch.cuda.memory_reserved(device)))
    if device.type == "cpu":
        try:
            with open("/proc/meminfo") as handle:
                for line in handle:
                    if line.startswith("MemAvailable:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            return None
    return None


def check_memory(config, dtype: torch.dtype | str, device: torch.device, device_map: Any) -> None:
    """Refuse (one line) a model whose weights alone would not fit in the device's free memory."""
    if device_map is not None or os.environ.get(SKIP_MEMORY_CHECK):
        return
    if not isinstance(dtype, torch.dtype):  # "auto": the checkpoint's own dtype
        dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None) or torch.float32
        dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    free = free_bytes(device)
    if free is None:
        return
    count = parameter_count(config)
    need = count * torch.empty((), dtype=dtype).element_size() * MEMORY_MARGIN
    if need > free:
        raise ModelCheckError(
            f"the model needs about {need / GIB:.1f} GiB ({count / 1e9:.2f} B parameters in "
            f"{str(dtype).removeprefix('torch.')}, with margin) but {device} has {free / GIB:.1f} GiB "
            f"free; use a smaller dtype, another device or device_map=auto ({SKIP_MEMORY_CHECK}=1 skips this check)")


def check_loaded_weights(info: dict, source: str) -> None:
    """Missing, unexpected or mismatched weights (from `output_loading_info`) are an error."""
    problems = []
    for kind in ("missing_keys", "unexpected_keys", "mismatched_keys"):
        keys = [k if isinstance(k, str) else k[0] for k in info.get(kind) or ()]
        keys = sorted(k for k in keys if not k.startswith(TOLERATED_PREFIXES))
        if keys:
            shown = ", ".join(keys[:3]) + (f" and {len(keys) - 3} more" if len(keys) > 3 else "")
            problems.append(f"{len(keys)} {kind.replace('_keys', '')} ({shown})")
    if problems:
        raise ModelCheckError(f"the weights in {source} do not match its config: {'; '.join(problems)}; "
                              "check config.json (num_hidden_layers, hidden_size...) against the checkpoint")


@torch.no_grad()
def check_finite(model: torch.nn.Module, source: str) -> None:
    """Every parameter finite, offloaded ones included; else one line naming the first bad tensor."""
    from prunelab.models.offloaded_weights import named_weights

    for name, tensor in named_weights(model):
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise ModelCheckError(f"the weights in {source} contain NaN or Inf (first in {name})")
