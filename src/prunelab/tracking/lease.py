"""A run's lease on its record, so that no run is ever computed by two processes at once.

`result.lease` beside the run's `result.json` (`<records>/<signature>/seed<n>/`) names who computes
the run, or will: a process (host, pid and its start time) or a SLURM job (`<array id>_<index>`,
with its restart count). Whoever wants to compute the run takes the lease first; a launcher takes
it before submitting and hands it to the job it submitted. The lease is taken over only when its
owner is provably gone:

- a SLURM job that `sacct` shows ended for good (COMPLETED, CANCELLED, NODE_FAIL, ...); a later
  attempt of the same job (SLURM requeued it: a higher SLURM_RESTART_COUNT) takes it too;
- a process on this host that no longer exists (or whose pid now belongs to another process);
- otherwise (another host, no `sacct` there), a lease without a heartbeat for `EXPIRES_S`: a
  running run touches its lease every `HEARTBEAT_S`, so a crashed owner never blocks for ever.

States: `submitting` (a launcher, before sbatch answers), `submitted` (a job not started yet),
`running` (computing, heartbeat), `requeue` (a SLURM job whose run was interrupted by a signal: SLURM
may run it again, so the job keeps the lease until `sacct` says it ended). A run ends by releasing
its lease; the record then says what became of the run.

Whoever finds the lease held by a live owner skips the run with one line naming the owner
(`RunHeld`). Decisions are made under an exclusive `flock` on the run's folder, so two claimants
never both take a free or stale lease.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from prunelab.errors import PrunelabError
from prunelab.files import atomic_write

log = logging.getLogger(__name__)

LEASE_NAME = "result.lease"
HEARTBEAT_S = 30.0
EXPIRES_S = 600.0
#: A launcher's token, inherited by the jobs it submits: a job takes the lease its launcher took for it.
TOKEN_VAR = "PRUNELAB_LEASE_TOKEN"

#: What SLURM says of a job: (still held, state), or None when it cannot be told (cluster/jobs.py).
SlurmVerdict = Callable[[str], "tuple[bool, str] | None"]


class RunHeld(PrunelabError):
    """Another live owner holds the run's lease: this process does not compute it."""

    def __init__(self, record: Path, lease: dict[str, Any]):
        self.lease, self.owner = lease, describe(lease.get("owner") or {})
        super().__init__(f"being computed by {self.owner} (lease {lease_path(record)}): skipped here")


def lease_path(record: str | Path) -> Path:
    return Path(record).with_name(LEASE_NAME)


def process_start(pid: int) -> str | None:
    """The process's start time in clock ticks (/proc), telling a recycled pid from the owner."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def process_alive(pid: int, start: str | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return start is None or process_start(pid) in (None, start)


def identity(token: str | None = None, in_slurm: bool = True) -> dict[str, Any]:
    """This process as a lease owner: host, pid, its SLURM job (when `in_slurm`) and its token."""
    pid = os.getpid()
    job, restart = None, 0
    if in_slurm and "SLURM_JOB_ID" in os.environ:
        array, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
        job = f"{array}_{task}" if array and task else os.environ["SLURM_JOB_ID"]
        restart = int(os.environ.get("SLURM_RESTART_COUNT") or 0)
    return {"host": socket.gethostname(), "pid": pid, "pid_start": process_start(pid), "slurm_job": job,
            "restart": restart, "token": token if token is not None else os.environ.get(TOKEN_VAR)}


def describe(owner: dict[str, Any]) -> str:
    """'SLURM job 12_0 (pid 311 on node3)', 'process 311 on laptop'."""
    where = f"pid {owner['pid']} on {owner.get('host')}" if owner.get("pid") else ""
    if owner.get("slurm_job"):
        return f"SLURM job {owner['slurm_job']}" + (f" ({where})" if where else "")
    return f"process {owner['pid']} on {owner.get('host')}" if where else "an unknown owner"


def read_lease(record: str | Path) -> dict[str, Any] | None:
    try:
        lease = json.loads(lease_path(record).read_text())
        lease["age_s"] = time.time() - lease_path(record).stat().st_mtime  # since the last heartbeat
        return lease
    except (OSError, json.JSONDecodeError, TypeError):
        return None


def _mine(lease: dict[str, Any], me: dict[str, Any]) -> bool:
    """The lease was taken for `me`: by my launcher (token), for my SLURM job, or by me."""
    owner = lease.get("owner") or {}
    if owner.get("token") and owner["token"] == me.get("token"):
        return True
    if owner.get("slurm_job") and owner["slurm_job"] == me.get("slurm_job") \
            and lease.get("state") in ("submitted", "requeue") and me.get("restart", 0) >= owner.get("restart", 0):
        return True
    return (owner.get("host"), owner.get("pid"), owner.get("pid_start")) == \
        (me.get("host"), me.get("pid"), me.get("pid_start"))


def gone(lease: dict[str, Any], slurm: SlurmVerdict, me: dict[str, Any]) -> str | None:
    """Why the lease's owner is provably gone, or None while it may still compute the run."""
    owner, state = lease.get("owner") or {}, lease.get("state")
    job = owner.get("slurm_job")
    if job and job == me.get("slurm_job") and me.get("restart", 0) > owner.get("restart", 0):
        return f"SLURM requeued job {job} (restart {me['restart']})"
    verdict = slurm(job) if job else None
    if verdict is not None:
        held, slurm_state = verdict
        if not held:
            return f"SLURM job {job} ended {slurm_state}"
        if state != "running":
            return None  # pending, or interrupted and maybe requeued: the job's while SLURM holds it
    if owner.get("pid") and owner.get("host") == me.get("host"):
        alive = process_alive(int(owner["pid"]), owner.get("pid_start"))
        return None if alive else f"process {owner['pid']} on {owner['host']} no longer exists"
    expires = float(lease.get("expires_s", EXPIRES_S))
    if lease.get("age_s", 0) > expires:
        return f"its lease expired ({lease['age_s']:.0f} s without a heartbeat, limit {expires:.0f} s)"
    return None


@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[None]:
    """An exclusive flock on the run's folder while a lease is decided on."""
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _write(record: Path, lease: dict[str, Any]) -> None:
    text = json.dumps({k: v for k, v in lease.items() if k != "age_s"}, indent=1).encode()
    atomic_write(lease_path(record), lambda handle: handle.write(text), "the run's lease")


def take(record: str | Path, slurm: SlurmVerdict, state: str = "running",
         owner: dict[str, Any] | None = None, expires_s: float = EXPIRES_S) -> dict[str, Any]:
    """Take the run's lease for `owner` (this process by default); returns it. Raises RunHeld when
    a live owner holds it; a lease whose owner is gone is taken over with a warning."""
    record, me = Path(record), owner or identity()
    with _locked(record.parent):
        lease = read_lease(record)
        if lease is not None and not _mine(lease, me):
            why = gone(lease, slurm, me)
            if why is None:
                raise RunHeld(record, lease)
            log.warning("taking over the lease of %s on %s: %s", describe(lease.get("owner") or {}),
                        record.parent, why)
        new = {"id": uuid.uuid4().hex, "state": state, "owner": me,
               "since": datetime.now(timezone.utc).isoformat(), "heartbeat_s": HEARTBEAT_S, "expires_s": expires_s}
        _write(record, new)
    return new


def holder(record: str | Path, slurm: SlurmVerdict, me: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The lease on the run while a live owner other than `me` holds it, else None."""
    lease = read_lease(record)
    me = me or identity()
    if lease is None or _mine(lease, me) or gone(lease, slurm, me) is not None:
        return None
    return lease


def _replace(record: Path, lease_id: str, change: Callable[[dict[str, Any]], dict[str, Any] | None]) -> bool:
    """Rewrite (or with None, remove) the lease if it is still the one with `lease_id`."""
    with _locked(record.parent):
        lease = read_lease(record)
        if lease is None or lease.get("id") != lease_id:
            return False
        new = change(lease)
        if new is None:
            lease_path(record).unlink(missing_ok=True)
        else:
            _write(record, new)
    return True


def hand_to(record: str | Path, lease: dict[str, Any], owner: dict[str, Any], state: str) -> None:
    """Give the lease to another owner (a launcher to the job it submitted), keeping its id."""
    _replace(Path(record), lease["id"], lambda old: {**old, "owner": owner, "state": state})


def keep_for_requeue(record: str | Path, lease: dict[str, Any]) -> None:
    """An interrupted run in a SLURM job: the lease stays the job's (SLURM may requeue it)."""
    def change(old: dict[str, Any]) -> dict[str, Any]:
        owner = old["owner"]
        return {**old, "state": "requeue", "owner": {
            "host": None, "pid": None, "pid_start": None, "slurm_job": owner.get("slurm_job"),
            "restart": owner.get("restart", 0), "token": owner.get("token")}}
    _replace(Path(record), lease["id"], change)


def release(record: str | Path, lease: dict[str, Any]) -> None:
    """Remove the lease if it is still this one (nobody took it over)."""
    _replace(Path(record), lease["id"], lambda old: None)


def release_job(record: str | Path, slurm_job: str | None = None, pid: int | None = None) -> None:
    """Remove the lease if it names this ended job (a SLURM job id, or a local job's pid)."""
    lease = read_lease(record) or {}
    owner = lease.get("owner") or {}
    if (slurm_job and owner.get("slurm_job") == slurm_job) or (pid and owner.get("pid") == pid
                                                               and not owner.get("slurm_job")):
        _replace(Path(record), lease["id"], lambda old: None)


@contextlib.contextmanager
def heartbeat(record: str | Path, lease: dict[str, Any], every_s: float = HEARTBEAT_S) -> Iterator[None]:
    """Touch the lease every `every_s` while the block runs (a daemon thread)."""
    stop = threading.Event()
    path = lease_path(record)

    def beat() -> None:
        while not stop.wait(every_s):
            current = read_lease(record)
            if current is None or current.get("id") != lease["id"]:
                log.error("the lease %s is no longer this run's (%s holds it)", path,
                          describe((current or {}).get("owner") or {}))
                return
            with contextlib.suppress(OSError):
                os.utime(path)

    thread = threading.Thread(target=beat, name="lease-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=5)
