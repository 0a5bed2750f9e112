"""A completed record is never lost: reruns write beside it, never over it.

`result.json` of a setting and seed is the one analysis reads. When a run ends:

- no completed record there yet: the new record becomes `result.json` (failed, interrupted or
  completed);
- a completed record is there and the rerun did not complete (failed, interrupted): the new record
  is kept aside as `result.<status>-<UTC time>.json` and `result.json` stays the completed one;
- a completed record is there and the rerun completed too: the old one moves aside to
  `result.previous-<UTC time>.json` and the new one becomes `result.json`.

Analysis only reads files named `result.json`, so kept-aside records never count twice.
"""

from __future__ import annotations

import logging
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from prunelab.files import storage_error
from prunelab.tracking.record import is_completed, read_record, write_record
from prunelab.tracking.saved_model import saved_model_present

log = logging.getLogger(__name__)


def aside_path(path: Path, status: str) -> Path:
    """`result.<status>-<UTC time>.json` beside `path`, not yet taken."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")
    candidate = path.with_name(f"{path.stem}.{status}-{stamp}.json")
    n = 1
    while candidate.exists():
        n += 1
        candidate = path.with_name(f"{path.stem}.{status}-{stamp}-{n}.json")
    return candidate


def write_keeping_completed(path: Path, record: dict[str, Any]) -> Path:
    """Write the run's record without ever replacing a completed one; returns where it went."""
    if not is_completed(path):
        return write_record(path, record)
    if record.get("status") != "completed":
        target = write_record(aside_path(path, str(record.get("status"))), record)
        log.warning("kept the completed record %s; this %s rerun's record is %s",
                    path, record.get("status"), target)
        return target
    previous = aside_path(path, "previous")
    try:
        os.replace(path, previous)
    except OSError as err:
        raise storage_error(err, "the previous record", previous) from None
    log.info("the earlier completed record moved to %s", previous)
    return write_record(path, record)


def finished_record(path: Path, save_model: bool = False) -> dict[str, Any] | None:
    """The completed record at `path` that makes a rerun unnecessary (with `save_model`, only one
    whose model was saved), else None. Runs skip on it, and so do launchers before submitting."""
    if not is_completed(path):
        return None
    done = read_record(path)
    return done if not save_model or saved_model_present(done) else None
