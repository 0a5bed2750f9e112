"""The record of a run that never reached the pipeline, so every run of a sweep ends with one.

`pipeline.run` writes a record whatever happens once it starts. A run of a sweep can end before
that: its config does not build (a bad input file: `stage: setup`), or its launched job ended
without reporting back (cancelled while pending, killed at the memory limit, a failed node:
`stage: job`, written by the launching process). The record sits where the run's own would
(`<records>/<signature>/seed<seed>/result.json`), says `failed` or `interrupted`, and is never
written over a completed one (tracking/keep.py), so a relaunch retries exactly these runs.
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from prunelab.tracking.attempts import with_attempts
from prunelab.tracking.environment import environment
from prunelab.tracking.keep import write_keeping_completed
from prunelab.tracking.record import SCHEMA_VERSION, config_signature, read_record, record_path


def unstarted_record_path(config: dict[str, Any]) -> Path:
    """Where the run of this resolved config (the record's `config`) writes its record."""
    return record_path(config["paths"]["records_dir"], config_signature(config), int(config["seed"]))


def write_unstarted(config: dict[str, Any], status: str, stage: str, error_type: str,
                    message: str, slurm: dict[str, Any] | None = None, job_state: str | None = None) -> Path:
    """Write the `failed` / `interrupted` record of a run that did not start; returns its path.
    `slurm`: the run's SLURM job, when another process (the launcher) writes the record;
    `job_state`: how `sacct` says that job ended (`failure.job_state`: NODE_FAIL, CANCELLED, ...)."""
    now = datetime.now(timezone.utc).isoformat()
    where = environment()
    if slurm is not None:
        where["slurm"] = slurm
    record = {
        "schema_version": SCHEMA_VERSION, "status": status, "signature": config_signature(config),
        "seed": int(config["seed"]), "study": config.get("study"), "labels": {}, "config": config,
        "started_at": now, "finished_at": now, "environment": where, "timings": {},
        "failure": {"stage": stage, "error_type": error_type, "message": message, "traceback": None,
                    **({"job_state": job_state} if job_state else {})},
    }
    path = unstarted_record_path(config)
    return write_keeping_completed(path, with_attempts(record, read_record(path)))
