"""What SLURM says of a job now, through `sacct` (submitit's watcher parses it): whether SLURM still
holds the job (pending, requeued, running again) or it has ended for good.

A requeued job keeps its id: `sacct` (without `--duplicates`) shows its latest allocation, so a job
that was interrupted and requeued reads `REQUEUED`, then `PENDING`, then `RUNNING` again. Only a
state outside `STILL_HELD` means the job will never run its run again (records, leases and the
launcher's wait rely on this).
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from pathlib import Path

log = logging.getLogger(__name__)

#: sacct states of a job SLURM still holds: it runs, will run (again) or may be resumed.
STILL_HELD = ("PENDING", "RUNNING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "SUSPENDED", "COMPLETING",
              "CONFIGURING", "RESIZING", "SIGNALING", "STAGE_OUT", "READY")


def job_state(job: str) -> str | None:
    """sacct's state of `job` (`<array id>_<index>` or a job id): `RUNNING`, `NODE_FAIL`, ...; None
    when it cannot be told (no sacct here, sacct fails, or the job is unknown to it)."""
    if shutil.which("sacct") is None:
        return None
    from submitit.slurm.slurm import SlurmInfoWatcher

    state = SlurmInfoWatcher(delay_s=0).get_state(job, mode="force")  # "CANCELLED by 0" -> CANCELLED
    state = (state or "UNKNOWN").split()[0].upper()
    return None if state == "UNKNOWN" else state


def still_held(state: str | None) -> bool:
    """SLURM has not finished with a job in this state (None, unknown: not proven ended)."""
    return state is None or state in STILL_HELD


def verdict(job: str) -> tuple[bool, str] | None:
    """(SLURM still holds the job, its state), or None when sacct cannot tell: what a run's lease
    asks of its owner's job (tracking/lease.py)."""
    state = job_state(job)
    return None if state is None else (still_held(state), state)


#: How often, at most, `sacct` is asked while waiting for a job (submitit's own polling slows to
#: every 10 minutes on long waits; a job lost with its node would go unnoticed that long).
POLL_S = 10.0
#: A job must read as ended this long before its run is reported as gone for good (accounting
#: shows a requeued job briefly in its old allocation's state).
CONFIRM_S = 5.0


def wait(job) -> None:
    """Until the submitit job has left its result or SLURM says it ended (sacct forced every POLL_S)."""
    forced = time.monotonic()
    while True:
        force = time.monotonic() - forced >= POLL_S
        if force:
            forced = time.monotonic()
        if job.done(force_check=force):
            return
        time.sleep(1)


def follow_requeue(job, label: str, poll_s: float = 3.0) -> bool:
    """After a run of a SLURM job came back interrupted: True once SLURM has requeued the job and
    its new attempt left a result (read it again), False when the job ended for good.

    The interrupted attempt's result is moved aside (`<job>_0_result.pkl.attempt-<n>`) so the next
    one is told from it."""
    pickle = Path(job.paths.result_pickle)
    n = 1
    while pickle.with_name(f"{pickle.name}.attempt-{n}").exists():
        n += 1
    os.replace(pickle, pickle.with_name(f"{pickle.name}.attempt-{n}"))
    announced, ended_at = False, None
    while True:
        if pickle.exists():
            log.info("%s: SLURM job %s ran again (attempt %d) and reported back", label, job.job_id, n + 1)
            return True
        state = job_state(job.job_id)
        if state is not None and not still_held(state):
            ended_at = ended_at or time.monotonic()
            if time.monotonic() - ended_at >= CONFIRM_S and not pickle.exists():
                log.info("%s: SLURM job %s ended %s, not requeued", label, job.job_id, state)
                return False
        else:
            ended_at = None
            if state in ("REQUEUED", "PENDING", "REQUEUE_HOLD") and not announced:
                log.info("%s: SLURM requeued job %s (%s): waiting for it to run again", label, job.job_id, state)
                announced = True
        time.sleep(poll_s)
