"""Every attempt at a run, in its record (`attempts`), so a record tells how often the run was
started and how each attempt ended: an interrupted attempt that SLURM requeued, a job lost with its
node, then the attempt that completed.

A record replaces the run's earlier one (tracking/keep.py); it carries the earlier record's
`attempts` (or, for a record written before this field existed, that record as one attempt) and
appends its own. Counting `status == "completed"` gives how often the run was computed to the end.
"""

from __future__ import annotations

from typing import Any


def attempt(record: dict[str, Any]) -> dict[str, Any]:
    """One attempt, summarized from the record it wrote (or the launcher wrote for it)."""
    failure = record.get("failure") or {}
    slurm = (record.get("environment") or {}).get("slurm") or {}
    return {"status": record.get("status"), "stage": failure.get("stage"), "message": failure.get("message"),
            "started_at": record.get("started_at"), "finished_at": record.get("finished_at"),
            "slurm_job": slurm.get("job"), "restart_count": slurm.get("restart_count")}


def with_attempts(record: dict[str, Any], previous: dict[str, Any] | None) -> dict[str, Any]:
    """`record` with `attempts`: the earlier record's attempts, then this one."""
    earlier: list[dict[str, Any]] = []
    if previous:
        earlier = list(previous.get("attempts") or [attempt(previous)])
    record["attempts"] = earlier + [attempt(record)]
    return record
