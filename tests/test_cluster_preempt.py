"""Issue 32 on a real SLURM cluster: a job requeued mid-run, a relaunch while the sweep's jobs run,
two sweeps over one records folder, a node lost mid-job. In every one each run ends with exactly one
completed record and was computed to completion exactly once (its record's `attempts`).

Marker `cluster`, like tests/test_cluster.py (whose helpers these use). The lost node needs the
cluster `.ci/slurm_cluster.sh` started (it kills that cluster's slurmd and the job's processes, then
starts slurmd again); it is skipped on any other cluster.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from test_cluster import Sweep, cluster, not_completed_lines, sacct, wait_for_log  # noqa: F401

pytestmark = pytest.mark.cluster
log = logging.getLogger(__name__)

SCRIPT = Path(__file__).resolve().parents[1] / ".ci" / "slurm_cluster.sh"
SLOW = ("pruning=slow_magnitude",)


def attempts(record: dict) -> list[tuple]:
    return [(a["status"], a["stage"], a["message"]) for a in record["attempts"]]


def no_leases_left(sweep: Sweep) -> None:
    assert not list(sweep.records_dir.glob("*/seed*/result.lease")), "a lease outlived its run"


def job_folders(sweep: Sweep) -> list[str]:
    """One folder per submitted SLURM job under the sweep's .submitit/: `21_0`, `21_1` for the tasks
    of an array (whose own folder `21` holds its submission script), `22` for a lone job (submitit
    submits a sweep of one run as a plain job, not as an array of one)."""
    names = {p.name for p in (sweep.root / "multirun" / ".submitit").glob("*") if p.is_dir()}
    tasks = {name for name in names if re.fullmatch(r"\d+_\d+", name)}
    arrays = {name.split("_")[0] for name in tasks}
    return sorted(tasks | {name for name in names if name.isdigit() and name not in arrays})


def start_requeued_job_now(job: str, timeout: float = 60) -> None:
    """SLURM holds a requeued job back for 2 minutes (BeginTime); let it start at once."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        state = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True).stdout
        if state.strip() == "PENDING" and subprocess.run(
                ["scontrol", "update", f"jobid={job}", "StartTime=now"], capture_output=True).returncode == 0:
            return
        time.sleep(0.5)
    raise AssertionError(f"{job} never became pending after the requeue")


def test_a_requeued_job_is_waited_for_and_its_run_completes_once(tmp_path):
    sweep = Sweep(tmp_path)
    began = time.time()
    process = sweep.start("-m", "seed=0,1", *SLOW, slow_seeds="0", slow_s=20)
    text = wait_for_log(tmp_path / "multirun" / "0", "slow run: sleeping", process)
    job = re.search(r"SLURM job (\d+_0) ", text).group(1)
    subprocess.run(["scontrol", "requeue", job], check=True)
    start_requeued_job_now(job)
    result = sweep.finish(process, ("requeue", job), began, timeout=480)
    log.info("scenario requeue: %.1f s", time.time() - began)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"SLURM requeued job {job}" in result.stdout + result.stderr
    records = sweep.by_seed(2)
    requeued = records[0]
    log.info("a requeued run's record: %s", json.dumps({k: requeued[k] for k in ("status", "attempts")}))
    assert requeued["status"] == "completed" and requeued["environment"]["slurm"]["job"] == job
    assert requeued["environment"]["slurm"]["restart_count"] == "1"
    assert attempts(requeued) == [("interrupted", "allocate", "SIGTERM"), ("completed", None, None)]
    assert [a["slurm_job"] for a in requeued["attempts"]] == [job, job]
    assert attempts(records[1]) == [("completed", None, None)]
    assert sacct(job)[job]["state"] == "COMPLETED" and len(job_folders(sweep)) == 2
    no_leases_left(sweep)


def test_a_relaunch_while_the_jobs_run_submits_nothing_and_waits_for_them(tmp_path):
    """Ctrl-C on the sweep while seed 0 runs and seed 1 waits behind it (one job at a time): the
    relaunch finds both runs leased to their jobs, submits nothing and reports their records."""
    sweep = Sweep(tmp_path)
    one_at_a_time = ("-m", "seed=0,1", *SLOW, "hydra.launcher.array_parallelism=1")
    began = time.time()
    first = sweep.start(*one_at_a_time, slow_seeds="0", slow_s=20)
    text = wait_for_log(tmp_path / "multirun" / "0", "slow run: sleeping", first)
    array = re.search(r"SLURM job (\d+)_0 ", text).group(1)
    first.send_signal(signal.SIGINT)
    _, stderr = first.communicate(timeout=60)
    assert first.returncode == 130 and "keep running" in stderr, stderr[-3000:]
    folders = job_folders(sweep)
    again = sweep.run(*one_at_a_time)
    log.info("scenario relaunch: %.1f s", time.time() - began)
    assert again.returncode == 0, again.stderr[-3000:]
    said = again.stdout + again.stderr
    assert f"seed=0: being computed by SLURM job {array}_0" in said, said[-3000:]
    assert f"seed=1: being computed by SLURM job {array}_1" in said, said[-3000:]
    assert job_folders(sweep) == folders and len(sweep.submissions()) == 1  # nothing submitted twice
    records = sweep.by_seed(2)
    for seed, record in records.items():
        assert record["environment"]["slurm"]["job"] == f"{array}_{seed}"
        assert attempts(record) == [("completed", None, None)]
    no_leases_left(sweep)


def test_two_sweeps_over_one_records_folder_compute_each_run_once(tmp_path):
    records = tmp_path / "records"
    sweeps = [Sweep(tmp_path / name, records) for name in ("a", "b")]
    for sweep in sweeps:
        sweep.root.mkdir()
    began = time.time()
    processes = [sweep.start("sweep=seeds3", "pruning=magnitude") for sweep in sweeps]
    results = [sweep.finish(p, ("sweep", sweep.root.name), began) for sweep, p in zip(sweeps, processes)]
    log.info("scenario two sweeps: %.1f s", time.time() - began)
    for result in results:
        assert result.returncode == 0, result.stderr[-3000:]
    runs = sweeps[0].by_seed(3)
    assert all(attempts(record) == [("completed", None, None)] for record in runs.values())
    submitted = job_folders(sweeps[0]) + job_folders(sweeps[1])
    assert len(submitted) == 3, submitted  # each run submitted by one sweep only
    for sweep, result in zip(sweeps, results):  # every run: submitted, left to the other, or done
        said = result.stdout + result.stderr
        left = said.count("not submitted; waiting for its record") + said.count("completed already, not submitted")
        assert len(job_folders(sweep)) + left == 3, said[-3000:]
    no_leases_left(sweeps[0])


def script_cluster() -> bool:
    state = Path(os.environ.get("PRUNELAB_SLURM_DIR", "/var/lib/prunelab-slurm"))
    return os.geteuid() == 0 and (state / "pids").is_file() and \
        str(state) in os.environ.get("SLURM_CONF", "")


def wait_for_state(job: str, state: str, timeout: float = 120) -> float:
    began = time.time()
    while time.time() - began < timeout:
        out = subprocess.run(["sacct", "-n", "-X", "-P", "-o", "State", "-j", job], capture_output=True,
                             text=True).stdout.split()
        if state in out:
            return time.time() - began
        time.sleep(1)
    raise AssertionError(f"{job} never reached {state}")


@pytest.mark.skipif(not script_cluster(), reason="needs the cluster .ci/slurm_cluster.sh started (as root)")
def test_a_lost_node_records_node_fail_and_a_relaunch_completes_the_run(tmp_path):
    sweep = Sweep(tmp_path)
    no_requeue = ("-m", "seed=0", *SLOW, "+hydra.launcher.additional_parameters.no_requeue=true")
    began = time.time()
    process = sweep.start(*no_requeue, slow_seeds="0", slow_s=600)
    text = wait_for_log(tmp_path / "multirun" / "0", "slow run: sleeping", process)
    job = re.search(r"SLURM job (\S+) \(job id", text).group(1)  # one run: a plain job, not an array
    try:
        subprocess.run(["bash", str(SCRIPT), "fail-node"], check=True)
        log.info("%s NODE_FAIL %.0f s after the node died", job, wait_for_state(job, "NODE_FAIL"))
    finally:
        subprocess.run(["bash", str(SCRIPT), "restore-node"], check=True)
    result = sweep.finish(process, ("lost node", job), began, timeout=300)
    assert result.returncode == 1, result.stderr[-3000:]
    lines = not_completed_lines(result.stderr)
    assert len(lines) == 2 and "the job ended NODE_FAIL" in lines[1] and lines[1].endswith(f"[SLURM job {job}]")
    record = sweep.by_seed(1)[0]
    assert record["status"] == "interrupted" and record["failure"]["stage"] == "job"
    assert record["failure"]["job_state"] == "NODE_FAIL" and record["environment"]["slurm"]["job"] == job
    no_leases_left(sweep)

    again = sweep.run(*no_requeue)
    log.info("scenario lost node: %.1f s", time.time() - began)
    assert again.returncode == 0, again.stderr[-3000:]
    rerun = sweep.by_seed(1)[0]
    assert rerun["status"] == "completed" and rerun["environment"]["slurm"]["job"] != job
    assert [(a["status"], a["stage"]) for a in rerun["attempts"]] == [("interrupted", "job"), ("completed", None)]
    no_leases_left(sweep)
