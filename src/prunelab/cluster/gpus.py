"""Which GPUs each run of a `local_parallel` sweep gets.

submitit's local executor starts every job with `CUDA_VISIBLE_DEVICES` set from its `gpus_per_node`
and `visible_gpus` parameters, and with none set it hides every GPU: a sweep on a GPU workstation
would then run on the CPU without a word. `hydra.launcher.gpus_per_node` is read here as the GPUs
of one run: null (the default) gives each run one GPU when the launching process sees any and keeps
the CPU behaviour (no GPU) otherwise; 0 hides the GPUs; k gives each run k of them. The visible GPUs
are split into groups of k, and a run starts only when a group is free, so that two runs never
share a GPU and a sweep of more runs than groups queues instead of oversubscribing.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence

from prunelab.errors import ConfigError


def visible_gpus() -> list[int]:
    """The GPUs this process may use, as the physical indices `CUDA_VISIBLE_DEVICES` names (a
    child's `CUDA_VISIBLE_DEVICES` replaces, not narrows, its parent's), else every GPU torch sees."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        names = [name.strip() for name in listed.split(",") if name.strip()]
        if not all(name.lstrip("-").isdigit() for name in names):
            raise ConfigError(f"CUDA_VISIBLE_DEVICES={listed} names GPUs by UUID; hydra/launcher=local_parallel "
                              "assigns GPUs by index: list them by index (nvidia-smi -L)")
        indices = [int(name) for name in names]
        return indices[:indices.index(-1)] if -1 in indices else indices  # CUDA stops at the first -1
    import torch

    return list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []


def gpus_per_run(requested: int | None, gpus: Sequence[int], cuda_available: bool) -> int:
    """GPUs for each run: `requested` (hydra.launcher.gpus_per_node), or, when unset, 1 where torch
    can use the visible GPUs and 0 elsewhere (the CPU, as before). More than there are is one line."""
    if requested is None:
        return 1 if gpus and cuda_available else 0
    if requested < 0:
        raise ConfigError(f"hydra.launcher.gpus_per_node={requested}: use 0 (CPU), a number of GPUs per run, "
                          "or null (one GPU per run when there are GPUs)")
    if requested > len(gpus):
        seen = ",".join(map(str, gpus)) or "none"
        raise ConfigError(f"hydra.launcher.gpus_per_node={requested} GPUs per run, but this process sees "
                          f"{len(gpus)} (GPUs: {seen}); use at most {len(gpus)}, or 0 for the CPU")
    return requested


def gpu_groups(gpus: Sequence[int], per_run: int) -> list[tuple[int, ...]]:
    """The visible GPUs split into disjoint groups of `per_run` (a remainder is left unused)."""
    return [tuple(gpus[start:start + per_run]) for start in range(0, len(gpus) - per_run + 1, per_run)]


class GpuSlots:
    """GPU groups handed to runs one at a time: `take` waits until a group is free again.

    A group is free once the job it was given to is done (`job.done()`, submitit's own check of
    the local process)."""

    def __init__(self, groups: list[tuple[int, ...]], poll_s: float = 2.0,
                 sleep: Callable[[float], None] = time.sleep):
        self.free = list(groups)
        self.busy: list[tuple[tuple[int, ...], object]] = []
        self.poll_s = poll_s
        self.sleep = sleep

    def take(self) -> tuple[int, ...]:
        while not self.free:
            self._release_finished()
            if not self.free:
                self.sleep(self.poll_s)
        return self.free.pop(0)

    def give(self, group: tuple[int, ...], job) -> None:
        """`group` is in use by `job` until it is done."""
        self.busy.append((group, job))

    def _release_finished(self) -> None:
        finished = [(group, job) for group, job in self.busy if job.done()]
        self.free.extend(group for group, _ in finished)
        self.busy = [entry for entry in self.busy if entry not in finished]
