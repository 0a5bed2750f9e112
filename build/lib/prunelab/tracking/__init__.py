"""Tracking: the local result record (always) and experiment trackers (W&B or none)."""

from prunelab.tracking.record import (
    config_signature, is_completed, read_record, record_path, write_record,
)
from prunelab.tracking.naming import RunNames, run_names
from prunelab.tracking.trackers import NoTracker, Tracker
from prunelab.tracking.wandb_tracker import WandbTracker

__all__ = [
    "NoTracker", "RunNames", "Tracker", "WandbTracker", "run_names", "config_signature", "is_completed", "read_record",
    "record_path", "write_record",
]
