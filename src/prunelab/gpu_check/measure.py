"""One row of the GPU node check: a step run once, timed, its peak memory taken, its outcome one
line; and the comparisons the checks make (mask entries that differ, perplexity).

A step returns its detail (ok), raises `CheckFailed` (a comparison out of tolerance: failed, with
the numbers), `NotApplicable` (skipped, saying why: never a pass) or anything else (failed, with
the error's first line). Peak memory is the CUDA allocator's on a GPU and the process's peak
resident memory on the CPU, each reset when the step starts.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

from prunelab.models.memory import (
    peak_device_memory, peak_rss, reset_peak_device_memory, reset_peak_rss, synchronize,
)

#: Mask entries allowed to differ between two devices (rounding-level flips), as a fraction.
MASK_TOLERANCE = 1e-3
#: Relative perplexity difference allowed between two devices of the same dtype.
PPL_TOLERANCE = 0.01


class CheckFailed(Exception):
    """The step ran but its result is wrong (a comparison out of tolerance): one line of numbers."""


class NotApplicable(Exception):
    """The step cannot run here (no CUDA, a torch without the API): skipped, never passed."""


@dataclass
class Row:
    """What the table prints and the JSON keeps for one step."""

    check: str
    status: str  # ok | failed | skipped
    seconds: float | None
    peak_memory_bytes: int | None
    detail: str

    def as_dict(self) -> dict:
        return asdict(self)


def one_line(err: BaseException) -> str:
    """'TypeName: first line of the message' (a traceback's worth of text would not fit a row)."""
    first = next((line.strip() for line in str(err).splitlines() if line.strip()), "")
    return f"{type(err).__name__}: {first}" if first else type(err).__name__


def measure(name: str, device: torch.device, step: Callable[[], str]) -> Row:
    """Run `step` once as the row `name`; prints one progress line on stderr."""
    print(f"gpu-check: {name} ...", end="", file=sys.stderr, flush=True)
    start = time.perf_counter()
    try:
        reset_peak_device_memory(device)  # inside: a device broken by an earlier step fails this row
        reset_peak_rss()
        detail, status = step(), "ok"
    except CheckFailed as err:
        detail, status = str(err), "failed"
    except NotApplicable as err:
        detail, status = str(err), "skipped"
    except Exception as err:  # any failure of the step is its row's, and the next check runs
        detail, status = one_line(err), "failed"
    seconds, peak = time_and_peak(device, start)
    print(f" {status} ({seconds:.1f} s)", file=sys.stderr, flush=True)
    return Row(name, status, round(seconds, 3), peak, detail)


def time_and_peak(device: torch.device, start: float) -> tuple[float, int | None]:
    """(seconds since `start` once the device is done, the peak memory since the reset); a device
    left broken by the step (a CUDA error) gives the time without a peak."""
    try:
        synchronize(device)
        peak = peak_device_memory(device) if device.type == "cuda" else peak_rss()
    except Exception:  # the step's own error is already in its row
        peak = None
    return time.perf_counter() - start, peak


def free_device_memory(device: torch.device) -> None:
    """Give the CUDA allocator's cached blocks back (between checks, and before a memory cap)."""
    import gc

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


@torch.no_grad()
def decoder_masks(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """name -> bool zero pattern (on the CPU) of every linear weight in the decoder layers; a
    streamed model's layers are read one at a time."""
    from prunelab.models.adapter import ModelAdapter

    masks = {}
    for index, layer in ModelAdapter(model).layers_in_memory():
        for name, module in layer.named_modules():
            if isinstance(module, torch.nn.Linear):
                masks[f"layers.{index}.{name}"] = (module.weight == 0).cpu()
    return masks


def differing_entries(first: dict[str, torch.Tensor], second: dict[str, torch.Tensor]) -> tuple[int, int]:
    """(mask entries that differ, entries compared); different linears or shapes are a failure."""
    if first.keys() != second.keys():
        raise CheckFailed(f"the pruned models have different linears: {sorted(first.keys() ^ second.keys())[:3]}")
    differ = total = 0
    for name, mask in first.items():
        if mask.shape != second[name].shape:
            raise CheckFailed(f"{name} has shape {tuple(mask.shape)} in one run, {tuple(second[name].shape)} in the other")
        differ += int((mask != second[name]).sum())
        total += mask.numel()
    return differ, total


def mask_summary(differ: int, total: int) -> str:
    """'identical masks (1,234,567 entries)' or '12 of 1,234,567 mask entries differ (0.0010%)'."""
    if differ == 0:
        return f"identical masks ({total:,} entries)"
    return f"{differ:,} of {total:,} mask entries differ ({100 * differ / max(total, 1):.4f}%)"


def perplexity(model: torch.nn.Module, ids: torch.Tensor, seqlen: int, windows: int) -> float:
    """Token perplexity over the first `windows` windows of `seqlen` of ids [1, L] (the
    SparseGPT/Wanda protocol, as the run's evaluation computes it)."""
    from prunelab.evaluation.perplexity import window_nlls

    nlls = window_nlls(model, ids, seqlen, max_windows=windows, progress=False)
    return math.exp(sum(nlls) / len(nlls))


def relative(value: float, reference: float) -> float:
    """value / reference - 1 (inf when either is not finite)."""
    if not (math.isfinite(value) and math.isfinite(reference)) or reference == 0:
        return math.inf
    return value / reference - 1
