"""Tracking: the local result record (always) and experiment trackers (W&B or none)."""

from prunelab.tracking.record import (
    config_signature, is_completed, read_record, record_path, write_record,
)
from prunelab.tracking.trackers import NoTracker, Tracker, WandbTracker

__all__ = [
    "NoTracker", "Tracker", "WandbTracker", "config_signature", "is_completed", "read_record",
    "record_path", "write_record",
]
