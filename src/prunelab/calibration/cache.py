"""On-disk cache of dense-model statistics: computed once, reused across a sweep.

A sweep over ratios and policies on one model, data set and calibration seed measures the dense
model the same way every time; the statistics are stored under `<cache_dir>/allocation/` (the folder
name predates this module and is kept so existing caches stay valid) keyed by the model's identity,
a hash of the calibration tensor (for data-aware statistics) and the statistic's name and
parameters. Files are written atomically (temporary file, then os.replace). With `ctx.cache_dir`
None nothing is cached.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from prunelab.context import PruneContext
from prunelab.models import cache_identity
from prunelab.files import atomic_write

log = logging.getLogger(__name__)

CACHE_VERSION = 1


def calibration_hash(samples: torch.Tensor) -> str:
    """Content hash of the [nsamples, seqlen] calibration token ids."""
    data = samples.detach().cpu().contiguous()
    digest = hashlib.sha256(f"{tuple(data.shape)}:{data.dtype}".encode())
    digest.update(data.numpy().tobytes())
    return digest.hexdigest()


def cache_path(ctx: PruneContext, statistic: str, params: dict[str, Any],
               uses_calibration: bool) -> Path | None:
    if ctx.cache_dir is None:
        return None
    key = {"version": CACHE_VERSION, "model": cache_identity(ctx.loaded), "statistic": statistic,
           "params": params, "calibration": calibration_hash(ctx.calibration()) if uses_calibration else None}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:24]
    return Path(ctx.cache_dir) / "allocation" / f"{statistic}-{digest}.pt"


def cached(ctx: PruneContext, statistic: str, params: dict[str, Any], compute: Callable[[], Any],
           uses_calibration: bool = True) -> Any:
    """compute() once per (model, calibration data, statistic, params); tensors, lists and dicts."""
    path = cache_path(ctx, statistic, params, uses_calibration)
    if path is not None and path.exists():
        try:
            value = torch.load(path, weights_only=True)
            log.info("dense statistic %s from cache %s", statistic, path)
            return value
        except Exception as err:  # a truncated or foreign file: recompute and overwrite
            log.warning("ignoring unreadable cache file %s (%s)", path, err)
    value = compute()
    if path is not None:
        atomic_write(path, lambda handle: torch.save(value, handle), "the allocation cache")
    return value
