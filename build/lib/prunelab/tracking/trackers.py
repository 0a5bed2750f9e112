"""Experiment trackers: the protocol the pipeline talks to, and `tracking=none`. The local record
never depends on a tracker; W&B is in `tracking.wandb_tracker`.

The pipeline calls `start` once, `log` as each stage finishes (and after each pruned layer),
`log_record` with the finished record, `log_artifact` for a saved model, and `finish`.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Protocol

from prunelab.tracking.naming import RunNames

log = logging.getLogger(__name__)


class Tracker(Protocol):
    def start(self, names: RunNames, config: dict[str, Any]) -> None: ...
    def log(self, metrics: dict[str, Any]) -> None: ...
    def log_record(self, record: dict[str, Any], path: Path | None = None) -> None: ...
    def log_artifact(self, path: Path, name: str, kind: str, metadata: dict[str, Any]) -> None: ...
    def finish(self, status: str) -> None: ...


def layer_matrices(details: dict[str, Any], prefix: str = "") -> dict[str, list[list[Any]]]:
    """Square all-pairs layer matrices inside a record's `pruning` details (WRP similarity, swap-KL
    replacement and interchange distances), found one nesting level deep."""
    found: dict[str, list[list[Any]]] = {}
    for key, value in details.items():
        if isinstance(value, dict) and not prefix:
            found.update(layer_matrices(value, f"{key}/"))
        elif (isinstance(value, list) and len(value) > 1 and all(isinstance(r, list) for r in value)
              and all(len(r) == len(value) for r in value)):
            found[prefix + key] = value
    return found


class NoTracker:
    """`tracking=none`: nothing leaves the machine except the local record."""

    def start(self, names: RunNames, config: dict[str, Any]) -> None:
        pass

    def log(self, metrics: dict[str, Any]) -> None:
        pass

    def log_record(self, record: dict[str, Any], path: Path | None = None) -> None:
        pass

    def log_artifact(self, path: Path, name: str, kind: str, metadata: dict[str, Any]) -> None:
        pass

    def finish(self, status: str) -> None:
        pass


def scalar_metrics(record: dict[str, Any]) -> dict[str, float]:
    """dense/<key>, pruned/<key> and delta/<key> (pruned - dense; relative % for perplexity)."""
    metrics = record.get("metrics") or {}
    dense, pruned = metrics.get("dense") or {}, metrics.get("pruned") or {}
    out = {f"dense/{k}": m["value"] for k, m in dense.items()}
    for key, metric in pruned.items():
        out[f"pruned/{key}"] = metric["value"]
        base = (dense.get(key) or {}).get("value")
        if base:
            change = 100 * (metric["value"] / base - 1) if key.startswith("ppl/") else metric["value"] - base
            out[f"{'change_pct' if key.startswith('ppl/') else 'delta'}/{key}"] = change
    return out
