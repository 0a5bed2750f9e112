"""Timing two models side by side: the same work, warmed up, alternated over repeats, summarised
by medians and paired ratios.

A time on a shared machine is only worth its ratio to another measured in the same minutes, so
each repeat times the dense and the pruned model back to back, in alternating order (A B, B A, ...),
and a speedup is the ratio of the two medians, with the spread of the per-repeat ratios. On CUDA
the clock is a pair of CUDA events after a synchronisation; on the CPU `time.perf_counter`.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from contextlib import contextmanager
from typing import Any, Iterator

import torch


def machine_load() -> dict[str, Any]:
    """The 1-minute load average and the CPUs this process may run on (None where unknown)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    try:
        load = round(os.getloadavg()[0], 2)
    except (OSError, AttributeError):
        load = None
    return {"load_average": load, "cpus": cpus}


def busy_while_timing(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """The machine's load around a timing, and whether other work competed for its CPUs (the load
    average, which counts this process too, above the CPUs): then the alternated ratios are still
    paired, but their spread widens and a single run's speedup can be off by far more than on a
    quiet machine (results/benchmarks/efficiency_benchmark.md)."""
    loads = [m["load_average"] for m in (before, after) if m["load_average"] is not None]
    busy = bool(loads) and before["cpus"] is not None and max(loads) > before["cpus"]
    return {"load_average_before": before["load_average"], "load_average_after": after["load_average"],
            "cpus": before["cpus"], "busy": busy}


def elapsed_seconds(work: Callable[[], Any], device: torch.device) -> float:
    """Wall time of `work()` on `device` (CUDA: events around it, synchronised)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        work()
        end.record()
        torch.cuda.synchronize(device)
        return start.elapsed_time(end) / 1000.0
    begin = time.perf_counter()
    work()
    return time.perf_counter() - begin


def alternated_times(works: dict[str, Callable[[], Callable[[], Any]]], device: torch.device,
                     repeats: int, warmup: int) -> dict[str, list[float]]:
    """Seconds of each named work per repeat, after `warmup` untimed runs of each. A work is
    prepared untimed (`works[name]()`, e.g. a prompt's KV cache) and the callable it returns is
    timed. The order of the works is reversed on every other repeat so that drift hits all alike."""
    names = list(works)
    for _ in range(warmup):
        for name in names:
            works[name]()()
    times: dict[str, list[float]] = {name: [] for name in names}
    for repeat in range(repeats):
        for name in (names if repeat % 2 == 0 else names[::-1]):
            times[name].append(elapsed_seconds(works[name](), device))
    return times


def quartiles(values: list[float]) -> tuple[float, float]:
    """(25th, 75th) percentiles; both the value itself for a single value."""
    if len(values) < 2:
        return values[0], values[0]
    q = statistics.quantiles(values, n=4, method="inclusive")
    return q[0], q[2]


def summary(times: list[float]) -> dict[str, Any]:
    """Median, quartiles, min and max of repeated times (seconds), and the times themselves."""
    low, high = quartiles(times)
    return {"median_s": statistics.median(times), "q25_s": low, "q75_s": high,
            "min_s": min(times), "max_s": max(times), "times_s": times}


def speedup(dense: list[float], pruned: list[float]) -> dict[str, Any]:
    """Dense time over pruned time: the ratio of the medians, and the quartiles of the paired
    per-repeat ratios (repeat i of both models ran back to back)."""
    ratios = [d / p for d, p in zip(dense, pruned)]
    low, high = quartiles(ratios)
    return {"speedup": statistics.median(dense) / statistics.median(pruned), "ratio_q25": low,
            "ratio_q75": high, "ratios": ratios}


def geometric_mean(values: list[float]) -> float:
    return float(torch.tensor(values, dtype=torch.float64).log().mean().exp())


@contextmanager
def fixed_threads(threads: int | None) -> Iterator[int]:
    """torch's intra-op threads set to `threads` (None: as they are) for the block; yields the
    number in force, restored afterwards."""
    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        yield torch.get_num_threads()
    finally:
        torch.set_num_threads(before)
