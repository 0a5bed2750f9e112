"""Issue 32: a run's lease (tracking/lease.py) lets one owner compute it at a time, is taken over only
from an owner that is provably gone, and never blocks for ever; records count their attempts. On a
real SLURM cluster (requeue, relaunch, two sweeps, a lost node): tests/test_cluster.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_cli import compose_config, tiny_run_overrides

from prunelab import pipeline
from prunelab.cli import build_setup
from prunelab.tracking import lease as leases
from prunelab.tracking.attempts import with_attempts

PRUNELAB = str(Path(sys.executable).with_name("prunelab"))
UNKNOWN = lambda job: None  # noqa: E731  (no sacct here)


@pytest.fixture
def other_process():
    """A live process on this host, as a lease owner."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield {**leases.identity(token=None, in_slurm=False), "pid": child.pid,
           "pid_start": leases.process_start(child.pid)}, child
    child.kill()
    child.wait()


def test_a_live_local_owner_holds_the_run_and_a_dead_one_is_taken_over(tmp_path, other_process):
    record = tmp_path / "sig" / "seed0" / "result.json"
    owner, child = other_process
    leases.take(record, UNKNOWN, owner=owner)
    with pytest.raises(leases.RunHeld, match=f"being computed by process {child.pid} on "):
        leases.take(record, UNKNOWN)
    assert leases.holder(record, UNKNOWN)["owner"]["pid"] == child.pid
    child.kill()
    child.wait()
    taken = leases.take(record, UNKNOWN)  # its process is gone
    assert taken["owner"]["pid"] == os.getpid() and leases.holder(record, UNKNOWN) is None
    leases.release(record, taken)
    assert not leases.lease_path(record).exists()


def test_a_recycled_pid_does_not_keep_a_lease(tmp_path):
    record = tmp_path / "result.json"
    me = leases.identity(in_slurm=False)
    leases.take(record, UNKNOWN, owner={**me, "pid_start": "1", "token": None})  # my pid, another start
    assert leases.take(record, UNKNOWN)["owner"]["pid_start"] == me["pid_start"]


def test_an_owner_on_another_host_holds_until_its_heartbeat_stops(tmp_path):
    record = tmp_path / "result.json"
    remote = {"host": "elsewhere", "pid": 1, "pid_start": None, "slurm_job": None, "restart": 0, "token": None}
    leases.take(record, UNKNOWN, owner=remote, expires_s=60)
    with pytest.raises(leases.RunHeld, match="process 1 on elsewhere"):
        leases.take(record, UNKNOWN)
    old = time.time() - 61
    os.utime(leases.lease_path(record), (old, old))  # no heartbeat for 61 s
    assert leases.take(record, UNKNOWN)["owner"]["host"] != "elsewhere"


def test_heartbeat_keeps_the_lease_fresh_and_stops_with_the_run(tmp_path):
    record = tmp_path / "result.json"
    lease = leases.take(record, UNKNOWN)
    old = time.time() - 500
    os.utime(leases.lease_path(record), (old, old))
    with leases.heartbeat(record, lease, every_s=0.05):
        time.sleep(0.3)
    assert leases.read_lease(record)["age_s"] < 5


def test_a_slurm_job_holds_its_run_while_slurm_holds_the_job(tmp_path):
    record = tmp_path / "result.json"
    job = {"host": None, "pid": None, "pid_start": None, "slurm_job": "7_0", "restart": 0, "token": "t1"}
    leases.take(record, UNKNOWN, state="submitted", owner=job, expires_s=1)
    old = time.time() - 100
    os.utime(leases.lease_path(record), (old, old))
    pending = lambda j: (True, "PENDING")  # noqa: E731
    with pytest.raises(leases.RunHeld, match="SLURM job 7_0"):  # pending for long: still its
        leases.take(record, pending)
    assert leases.take(record, lambda j: (False, "CANCELLED"))["owner"]["slurm_job"] is None


def test_the_job_a_launcher_submitted_and_its_requeued_attempt_take_the_run(tmp_path, monkeypatch):
    record = tmp_path / "result.json"
    for var in [v for v in os.environ if v.startswith("SLURM")] + [leases.TOKEN_VAR]:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("SLURM_JOB_ID", "12")
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "10")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "2")
    running = lambda j: (True, "RUNNING")  # noqa: E731
    job = {"host": None, "pid": None, "pid_start": None, "slurm_job": "10_2", "restart": 0, "token": None}
    leases.take(record, running, state="submitted", owner=job)
    first = leases.take(record, running)  # the launcher's lease, handed to this job
    assert first["owner"]["slurm_job"] == "10_2" and first["owner"]["pid"] == os.getpid()
    leases.keep_for_requeue(record, first)  # interrupted: the job keeps the run
    assert leases.read_lease(record)["state"] == "requeue"
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "3")
    with pytest.raises(leases.RunHeld, match="SLURM job 10_2"):  # another job while 10_2 is requeued
        leases.take(record, lambda j: (True, "PENDING"))
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "2")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    assert leases.take(record, running)["owner"]["restart"] == 1  # SLURM's next attempt at 10_2


def test_release_leaves_a_lease_taken_over_by_someone_else(tmp_path):
    record = tmp_path / "result.json"
    mine = leases.take(record, UNKNOWN)
    theirs = {**mine, "id": "another"}
    leases._write(record, theirs)
    leases.release(record, mine)
    assert leases.read_lease(record)["id"] == "another"


def test_attempts_carry_over_from_the_earlier_record():
    old = {"status": "interrupted", "failure": {"stage": "allocate", "message": "SIGTERM"}, "started_at": "a",
           "environment": {"slurm": {"job": "3_0", "restart_count": "0"}}}
    new = with_attempts({"status": "completed", "failure": None, "environment": {"slurm": {"job": "3_0",
                                                                                         "restart_count": "1"}}}, old)
    assert [(a["status"], a["stage"], a["restart_count"]) for a in new["attempts"]] == \
        [("interrupted", "allocate", "0"), ("completed", None, "1")]
    assert len(with_attempts({"status": "completed"}, new)["attempts"]) == 3


def _setup(tiny_model_dirs, text_file, tmp_path):
    overrides = tiny_run_overrides(tiny_model_dirs["llama"], text_file, tmp_path)
    return build_setup(compose_config(overrides + ["pruning=magnitude", "evaluation=ppl"]))


def test_a_run_held_elsewhere_computes_nothing_and_a_free_run_records_its_attempt(
        tiny_model_dirs, text_file, tmp_path, other_process):
    setup = _setup(tiny_model_dirs, text_file, tmp_path)
    owner, child = other_process
    leases.take(setup.record_file, UNKNOWN, owner=owner)
    with pytest.raises(leases.RunHeld, match=f"process {child.pid}"):
        pipeline.run(setup)
    assert not setup.record_file.exists()
    child.kill()
    child.wait()
    record = pipeline.run(setup)
    assert record["status"] == "completed" and not leases.lease_path(setup.record_file).exists()
    assert [a["status"] for a in json.loads(setup.record_file.read_text())["attempts"]] == ["completed"]


def test_the_cli_skips_a_held_run_in_one_line(tiny_model_dirs, text_file, tmp_path, other_process):
    command = [PRUNELAB, *tiny_run_overrides(tiny_model_dirs["llama"], text_file, tmp_path), "pruning=magnitude",
               "evaluation=ppl", "runtime.skip_completed=false"]
    first = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr[-2000:]
    [record] = (tmp_path / "records").glob("*/seed0/result.json")
    finished = json.loads(record.read_text())["finished_at"]
    owner, child = other_process
    leases.take(record, UNKNOWN, owner=owner)
    result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 1, result.stderr[-2000:]
    [line] = [line for line in result.stderr.splitlines() if line.startswith("prunelab:")]
    assert f"being computed by process {child.pid} on " in line and "skipped here" in line
    assert json.loads(record.read_text())["finished_at"] == finished
    assert len(list(record.parent.glob("result*.json"))) == 1  # nothing computed, nothing kept aside


def test_a_local_parallel_sweep_waits_for_a_run_another_process_holds(tiny_model_dirs, text_file, tmp_path,
                                                                      other_process):
    """The launcher takes leases too: a run held elsewhere is not started; the sweep waits until the
    owner is gone, then reports the run by its record."""
    command = [PRUNELAB, "-m", "hydra/launcher=local_parallel", f"hydra.sweep.dir={tmp_path / 'multirun'}",
               *tiny_run_overrides(tiny_model_dirs["llama"], text_file, tmp_path), "pruning=magnitude",
               "evaluation=ppl", "runtime.threads=1", "runtime.skip_completed=false"]
    first = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr[-2000:]
    [record] = (tmp_path / "records").glob("*/seed0/result.json")
    started = sorted((tmp_path / "multirun" / ".submitit").iterdir())
    owner, child = other_process
    leases.take(record, UNKNOWN, owner=owner)
    second = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(15)
    assert second.poll() is None  # waiting for the owner
    child.kill()
    child.wait()
    out, err = second.communicate(timeout=120)
    assert second.returncode == 0, err[-2000:]
    assert f"being computed by process {child.pid} on " in out + err
    assert sorted((tmp_path / "multirun" / ".submitit").iterdir()) == started  # nothing started
