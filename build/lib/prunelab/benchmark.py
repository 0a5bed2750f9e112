"""Wall time and peak resident memory of pipeline stages, for the benchmarks in experiments/.

`MemorySampler` polls the process RSS in a background thread (every few milliseconds), so each
stage gets its own peak rather than the process-lifetime maximum that `getrusage` reports.
`layer_sequential_bound` is the memory a layer-sequential method is allowed: the weights, one layer
(its working copy), two activation buffers, and the method's per-layer state (SparseGPT's Hessians).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import psutil
import torch


class MemorySampler:
    """Peak RSS (bytes) while the sampler runs."""

    def __init__(self, interval: float = 0.005):
        self.interval = interval
        self.process = psutil.Process()
        self.peak = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.process.memory_info().rss)
            time.sleep(self.interval)

    def __enter__(self) -> MemorySampler:
        self.peak = self.process.memory_info().rss
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join()
        self.peak = max(self.peak, self.process.memory_info().rss)


@dataclass
class StageMeasurements:
    rows: list[dict] = field(default_factory=list)

    @contextmanager
    def stage(self, name: str, **labels) -> Iterator[None]:
        start_rss = psutil.Process().memory_info().rss
        with MemorySampler() as sampler:
            start = time.perf_counter()
            yield
            seconds = time.perf_counter() - start
        self.rows.append({**labels, "stage": name, "seconds": seconds, "rss_start_mb": start_rss / 2**20,
                          "rss_peak_mb": sampler.peak / 2**20,
                          "rss_increase_mb": (sampler.peak - start_rss) / 2**20})


def tensor_bytes(module: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


def layer_sequential_bound(model: torch.nn.Module, layers, nsamples: int, seqlen: int, hidden: int,
                           extra_per_layer: int = 0) -> dict[str, float]:
    """Allowed bytes for a layer-sequential method: weights + one layer + 2 activation buffers
    ([N, T, C] fp32 each) + the method's per-layer state."""
    weights = tensor_bytes(model)
    layer = max(tensor_bytes(layer) for layer in layers)
    activations = 2 * nsamples * seqlen * hidden * 4
    return {"weights_mb": weights / 2**20, "one_layer_mb": layer / 2**20,
            "activation_buffers_mb": activations / 2**20, "method_state_mb": extra_per_layer / 2**20,
            "bound_mb": (weights + layer + activations + extra_per_layer) / 2**20}


def keep_unmeasured_rows(table: pd.DataFrame, previous_csv: Path, key: str = "model") -> pd.DataFrame:
    """``table`` plus the rows of ``previous_csv`` whose ``key`` was not measured this time.

    Lets a benchmark re-measure one model (e.g. ``--skip-1b`` after a testbed retrain) without
    discarding the committed rows of the models it skipped.
    """
    if not previous_csv.exists():
        return table
    previous = pd.read_csv(previous_csv)
    if key not in previous.columns or key not in table.columns:
        return table
    kept = previous[~previous[key].isin(set(table[key]))]
    return pd.concat([table, kept], ignore_index=True) if len(kept) else table
