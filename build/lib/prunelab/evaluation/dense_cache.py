"""Dense metrics computed once per model and protocol, cached as checked JSON.

The cache file holds the model identity (weights by content), the evaluators' protocol stamps
(which include the sha256 of the evaluated tokens or documents) and a checksum of the metrics.
All of it is compared before use; a truncated, edited or mismatched file is recomputed and
rewritten with one warning line.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

from prunelab.files import atomic_write

log = logging.getLogger(__name__)

FORMAT = 2


def _plain(value: Any) -> Any:
    """As it reads back from JSON (tuples become lists, odd types strings)."""
    return json.loads(json.dumps(value, default=str))


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


def cache_file(cache_dir: Path, identity: dict, stamps: dict) -> Path:
    key = _digest({"model": identity, "stamps": stamps})[:24]
    return Path(cache_dir) / "dense" / f"{key}.json"


def read_checked(path: Path, identity: dict, stamps: dict) -> tuple[dict | None, str]:
    """(metrics, "") when the file is whole and made for this model and these stamps."""
    try:
        entry = json.loads(path.read_text())
        metrics = entry["metrics"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        return None, f"is unreadable ({type(err).__name__})"
    if entry.get("format") != FORMAT:
        return None, "has an old format"
    if entry.get("checksum") != _digest(metrics):
        return None, "does not match its checksum (edited or damaged)"
    if entry.get("model") != _plain(identity):
        return None, "belongs to other model weights"
    if entry.get("stamps") != _plain(stamps):
        return None, "was measured under other protocol stamps"
    for key, stamp in _plain(stamps).items():
        protocol = (metrics.get(key) or {}).get("protocol") or {}
        if any(protocol.get(k) != v for k, v in stamp.items()):
            return None, f"has a {key} stamp that differs from this run's"
    return metrics, ""


def write(path: Path, identity: dict, stamps: dict, metrics: dict) -> None:
    entry = {"format": FORMAT, "model": identity, "stamps": stamps, "metrics": metrics,
             "checksum": _digest(_plain(metrics))}
    text = json.dumps(entry, indent=1, sort_keys=True, default=str).encode()
    atomic_write(path, lambda handle: handle.write(text), "the dense-metrics cache")
