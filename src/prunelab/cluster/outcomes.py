"""What became of each run of a sweep, gathered in the process that launched it.

A launched job (submitit: `hydra/launcher=slurm`, `slurm_cpu`, `local_parallel`) runs in its own
process, so it cannot add to the launching process's list of failed runs; it returns its outcome
instead (a completed run returns its record): `{"status": "failed" | "interrupted" | "skipped",
"job": <the run's overrides>, "message": ..., "slurm_job": <id or None>}`; `skipped`: another live
process or SLURM job holds the run's lease (tracking/lease.py), so this job computed nothing. The launcher turns every job's end,
including a job that never reported back, into one line of `NOT_COMPLETED`; `prunelab` prints them
and exits 1. Runs of the basic launcher (one process) add their line directly.
"""

from __future__ import annotations

import os
import sys
from typing import Any

#: (status, "<overrides>: <why>") for each run of this process's sweep that failed, was interrupted or
#: was skipped (its lease held elsewhere).
NOT_COMPLETED: list[tuple[str, str]] = []


def in_launched_job() -> bool:
    """This process is a job submitit started (SUBMITIT_FOLDER is set by submitit's job runner)."""
    return "SUBMITIT_FOLDER" in os.environ


def outcome(status: str, job: str, message: str) -> dict[str, Any]:
    """A launched job's return value for a run that did not complete."""
    slurm = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    slurm_job = f"{slurm[0]}_{slurm[1]}" if all(slurm) else os.environ.get("SLURM_JOB_ID")
    return {"status": status, "job": job, "message": message, "slurm_job": slurm_job}


def note(status: str, job: str, message: str, slurm_job: str | None = None) -> None:
    """Add the line of a run that did not complete (status failed, interrupted or skipped)."""
    where = f" [SLURM job {slurm_job}]" if slurm_job else ""
    NOT_COMPLETED.append((status, f"{job or '(no overrides)'}: {message}{where}"))


def status_and_message(value: Any) -> tuple[str, str]:
    """(status, message) of a launched job's return value ("completed" for a record)."""
    if isinstance(value, dict) and value.get("status") in ("completed", "failed", "interrupted", "skipped"):
        return value["status"], str(value.get("message", value["status"]))
    return "failed", f"the job returned {type(value).__name__}, not a record"


def note_returned(value: Any, job: str, slurm_job: str | None = None) -> bool:
    """Note a launched job's return value if its run did not complete; True if it did. `job` is
    the launcher's label of the run (the overrides that tell it from the sweep's other runs)."""
    status, message = status_and_message(value)
    if status == "completed":
        return True
    note(status, job, message, (value.get("slurm_job") if isinstance(value, dict) else None) or slurm_job)
    return False


def report() -> int:
    """Print the runs that did not complete (stderr); the exit code: 1 if any, else 0."""
    if not NOT_COMPLETED:
        return 0
    statuses = {status for status, _ in NOT_COMPLETED}
    what = "failed or were interrupted" if "interrupted" in statuses else "failed"
    if "skipped" in statuses:
        what = "did not complete here" if statuses - {"skipped"} else "were left to the process that holds them"
    print(f"prunelab: {len(NOT_COMPLETED)} run(s) of the sweep {what} (records say why; relaunch "
          "the same command to rerun just those that did not complete):", file=sys.stderr)
    for _, line in NOT_COMPLETED:
        print(f"  {line}", file=sys.stderr)
    return 1
