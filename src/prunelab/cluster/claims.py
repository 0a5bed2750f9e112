"""A launcher's leases on the runs of its sweep (tracking/lease.py), so that a relaunch, a second sweep
over the same records folder, or a requeued job never submits or computes a run a live job holds.

Before submitting, the launcher takes each run's lease (state `submitting`, owned by its own
process); after sbatch answers it hands each lease to the run's job (`submitted`: the SLURM job, or
the local job's process). Its jobs inherit a token (`PRUNELAB_LEASE_TOKEN`) that lets them take
the leases taken for them, even before the hand-over. A run whose lease another live owner holds is
not submitted: the launcher waits until that owner lets go and reports the run by its record.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from prunelab.cluster import jobs
from prunelab.tracking import lease as leases

log = logging.getLogger(__name__)

#: How often a run held by another owner is checked while the command waits for it.
HOLDER_POLL_S = 5.0


def record_path(config: dict[str, Any]) -> Path:
    from prunelab.tracking.unstarted import unstarted_record_path

    return unstarted_record_path(config)


class Claims:
    """The leases one launch takes, hands to its jobs, and waits on."""

    def __init__(self, executor: str):
        self.executor = executor  # "slurm" or "local"
        self.token = uuid.uuid4().hex
        self.taken: set[Path] = set()

    def me(self) -> dict[str, Any]:
        """This launching process as a lease owner (never its own SLURM job, if it runs in one)."""
        return leases.identity(self.token, in_slurm=False)

    def take(self, config: dict[str, Any], idx: int, label: str) -> dict[str, Any] | None:
        """The run's lease, taken for the job about to be submitted; None (one line naming the
        owner) when another live owner holds it, or an earlier run of this sweep is the same run."""
        path = record_path(config)
        if path in self.taken:
            log.info("#%d %s: the same run as an earlier one of this sweep: waiting for it", idx, label)
            return None
        try:
            lease = leases.take(path, jobs.verdict, state="submitting", owner=self.me())
        except leases.RunHeld as held:
            log.warning("#%d %s: being computed by %s: not submitted; waiting for its record", idx, label,
                        held.owner)
            return None
        self.taken.add(path)
        return lease

    def release(self, config: dict[str, Any], lease: dict[str, Any]) -> None:
        leases.release(record_path(config), lease)
        self.taken.discard(record_path(config))

    @contextlib.contextmanager
    def token_for_jobs(self) -> Iterator[None]:
        """The token in the environment the submitted jobs inherit (sbatch exports it)."""
        before = os.environ.get(leases.TOKEN_VAR)
        os.environ[leases.TOKEN_VAR] = self.token
        try:
            yield
        finally:
            if before is None:
                os.environ.pop(leases.TOKEN_VAR, None)
            else:
                os.environ[leases.TOKEN_VAR] = before

    def job_owner(self, job) -> dict[str, Any]:
        """A submitted job as its run's lease owner: the SLURM job, or the local job's process."""
        if self.executor == "slurm":
            return {"host": None, "pid": None, "pid_start": None, "slurm_job": job.job_id, "restart": 0,
                    "token": self.token}
        pid = int(job.job_id)
        return {"host": socket.gethostname(), "pid": pid, "pid_start": leases.process_start(pid),
                "slurm_job": None, "restart": 0, "token": self.token}

    def hand_to(self, config: dict[str, Any], lease: dict[str, Any], job) -> None:
        leases.hand_to(record_path(config), lease, self.job_owner(job), "submitted")

    def job_ended(self, config: dict[str, Any] | None, job) -> None:
        """The job is over for good: the lease it may have left on its run goes."""
        if config is None:
            return
        slurm = job.job_id if self.executor == "slurm" else None
        leases.release_job(record_path(config), slurm_job=slurm, pid=None if slurm else int(job.job_id))

    def wait_for_holder(self, config: dict[str, Any]) -> None:
        """Until no live owner but this launch holds the run's lease."""
        path = record_path(config)
        while leases.holder(path, jobs.verdict, self.me()) is not None:
            time.sleep(HOLDER_POLL_S)
