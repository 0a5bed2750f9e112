"""Sweeps through `hydra/launcher=slurm_cpu` on a real SLURM cluster, checked from the records and
`sacct`: a 3-seed sweep and its relaunch, `scancel` of a running job, a job past its time limit, a
run that fails. Every run of every sweep must end with exactly one record.

Marker `cluster` (not in `make test`); `.ci/run` starts a single-node cluster first
(`.ci/slurm_cluster.sh start`). Skipped, with the reason, where `sinfo` or `sacct` do not answer.
Slow runs come from tests/cluster_support (a pruning option that sleeps in `allocate` for the seeds
in PRUNELAB_TEST_SLOW_SEEDS, reached through PRUNELAB_CONF): the variable is not part of the config,
so a relaunch without it is the same setting at full speed.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.cluster
log = logging.getLogger(__name__)

PRUNELAB = str(Path(sys.executable).with_name("prunelab"))
SUPPORT = Path(__file__).resolve().parent / "cluster_support"
FINAL_STATES = ("COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED")


def slurm_unreachable() -> str | None:
    """Why no cluster can be used here, or None."""
    for command in (["sinfo", "-h", "-o", "%T"], ["sacct", "-n", "-X", "-S", "now"]):
        if shutil.which(command[0]) is None:
            return (f"no SLURM here ({command[0]} is not on PATH); `bash .ci/slurm_cluster.sh start` "
                    "starts a single-node cluster")
        try:
            result = subprocess.run(command, capture_output=True, text=True, timeout=30)
        except subprocess.TimeoutExpired:
            return f"SLURM does not answer: `{' '.join(command)}` took over 30 s"
        if result.returncode:
            why = (result.stderr.strip().splitlines() or ["no output"])[-1]
            return f"SLURM not reachable: `{' '.join(command)}` failed ({why}); is SLURM_CONF set?"
    return None


@pytest.fixture(scope="module", autouse=True)
def cluster():
    reason = slurm_unreachable()
    if reason:
        pytest.skip(reason)


def default_sigint() -> None:
    """In the sweep's process, Ctrl-C as a terminal gives it: a test suite started in the
    background by a non-interactive shell (`cmd &`, as CI may be) has SIGINT ignored, which every
    child inherits, and Python then never raises KeyboardInterrupt (the relaunch scenario's
    Ctrl-C would be lost)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Sweep:
    """`prunelab` sweeps of the testbed through hydra/launcher=slurm_cpu in one folder."""

    def __init__(self, root: Path, records: Path | None = None):
        self.root = root
        self.records_dir = records or root / "records"
        self.base = ["hydra/launcher=slurm_cpu", "hydra.launcher.cpus_per_task=1", "hydra.launcher.mem_gb=2",
                     f"hydra.sweep.dir={root / 'multirun'}", "model=testbed_llama", "evaluation=ppl",
                     "evaluation.perplexity.max_windows=2", "evaluation.perplexity.seqlen=128",
                     "data.calibration.nsamples=4", "runtime.threads=1", "runtime.progress=false",
                     "tracking=none", f"paths.records_dir={self.records_dir}", f"paths.cache_dir={root / 'cache'}"]

    def env(self, slow_seeds: str = "", slow_s: float = 600) -> dict[str, str]:
        path = os.pathsep.join(p for p in (str(SUPPORT), os.environ.get("PYTHONPATH", "")) if p)
        return {**os.environ, "PYTHONPATH": path, "PRUNELAB_CONF": str(SUPPORT / "conf"),
                "HF_HUB_OFFLINE": "1", "PRUNELAB_TEST_SLOW_SEEDS": slow_seeds, "PRUNELAB_TEST_SLOW_S": str(slow_s)}

    def start(self, *overrides: str, slow_seeds: str = "", slow_s: float = 600) -> subprocess.Popen:
        flags = [o for o in overrides if o.startswith("-")]  # -m: before the overrides
        overrides = tuple(o for o in overrides if not o.startswith("-"))
        return subprocess.Popen([PRUNELAB, *flags, *self.base, *overrides], cwd=self.root,
                                env=self.env(slow_seeds, slow_s), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, preexec_fn=default_sigint)

    def run(self, *overrides: str, slow_seeds: str = "", timeout: float = 600) -> subprocess.CompletedProcess:
        began = time.time()
        process = self.start(*overrides, slow_seeds=slow_seeds)
        return self.finish(process, overrides, began, timeout)

    def finish(self, process: subprocess.Popen, overrides, began: float, timeout: float = 600):
        """Wait for a started sweep; its output, exit code and time are logged."""
        out, err = process.communicate(timeout=timeout)
        log.info("sweep %s: %.1f s, exit %d", " ".join(overrides), time.time() - began, process.returncode)
        return subprocess.CompletedProcess(process.args, process.returncode, out, err)

    def records(self, runs: int) -> dict[str, dict]:
        """Every run's record, by '<signature>/seed<n>'; exactly one file per run, no other."""
        files = sorted(self.records_dir.glob("*/seed*/*.json"))
        assert all(f.name == "result.json" for f in files), [str(f) for f in files]
        assert len(files) == runs, [str(f) for f in files]
        return {f"{f.parent.parent.name}/{f.parent.name}": json.loads(f.read_text()) for f in files}

    def by_seed(self, runs: int) -> dict[int, dict]:
        return {record["seed"]: record for record in self.records(runs).values()}

    def submissions(self) -> list[Path]:
        """One sbatch submission file per sbatch call (an array or a single job)."""
        return sorted((self.root / "multirun" / ".submitit").glob("*/*_submission.sh"))


def sacct(job: str, timeout: float = 60) -> dict[str, dict[str, str]]:
    """sacct's JobID -> {JobIDRaw, State, Timelimit} for a job or array, once every state is final
    (accounting lags a few seconds behind the job)."""
    deadline = time.time() + timeout
    while True:
        out = subprocess.run(["sacct", "-n", "-X", "-P", "-o", "JobID,JobIDRaw,State,Timelimit", "-j", job],
                             capture_output=True, text=True, check=True).stdout
        rows = {line.split("|")[0]: dict(zip(("raw", "state", "limit"), line.split("|")[1:]))
                for line in out.splitlines() if line}
        if rows and all(r["state"].split()[0] in FINAL_STATES for r in rows.values()):
            return rows
        assert time.time() < deadline, f"sacct never showed {job} finished: {rows}"
        time.sleep(1)


def wait_for_log(folder: Path, text: str, process: subprocess.Popen, timeout: float = 300) -> str:
    """The log of Hydra's job folder once it contains `text`."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        logs = [p.read_text() for p in folder.glob("*.log")]
        if any(text in content for content in logs):
            return next(c for c in logs if text in c)
        assert process.poll() is None, process.communicate()[1][-3000:]
        time.sleep(0.5)
    raise AssertionError(f"{text!r} never appeared in {folder}")


def not_completed_lines(stderr: str) -> list[str]:
    """The sweep's closing lines: the header, then one line per run that did not complete."""
    assert "Traceback" not in stderr, stderr[-3000:]
    lines = stderr.strip().splitlines()
    header = next(i for i, line in enumerate(lines) if "run(s) of the sweep" in line)
    return lines[header:]


def test_seeds3_records_name_their_jobs_and_a_relaunch_submits_nothing(tmp_path):
    sweep = Sweep(tmp_path)
    result = sweep.run("sweep=seeds3", "pruning=magnitude")
    assert result.returncode == 0, result.stderr[-3000:]
    records = sweep.by_seed(3)
    assert sorted(records) == [0, 1, 2] and {r["status"] for r in records.values()} == {"completed"}
    slurm = {seed: r["environment"]["slurm"] for seed, r in records.items()}
    [array] = {s["array_job_id"] for s in slurm.values()}
    assert sorted(int(s["array_task_id"]) for s in slurm.values()) == [0, 1, 2]
    accounting = sacct(array)
    for seed, job in slurm.items():
        assert job["job"] == f"{array}_{job['array_task_id']}" and job["partition"] and job["node"]
        assert accounting[job["job"]]["raw"] == job["job_id"]
        assert accounting[job["job"]]["state"] == "COMPLETED"
        logs = tmp_path / "multirun" / ".submitit" / job["job"]  # where the README says
        assert job["stdout"] == str(logs / f"{job['job']}_0_log.out") and job["stderr"] == str(logs / f"{job['job']}_0_log.err")
        assert f"SLURM job {job['job']}" in Path(job["stdout"]).read_text()
        copy = json.loads((tmp_path / "multirun" / str(seed) / "result.json").read_text())
        assert copy["finished_at"] == records[seed]["finished_at"]  # Hydra's job folder keeps a copy
    submitted = sweep.submissions()
    assert len(submitted) == 1

    again = sweep.run("sweep=seeds3", "pruning=magnitude")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "nothing to submit" in again.stdout + again.stderr
    assert sweep.submissions() == submitted and len(sacct(array)) == 3
    assert {s: r["finished_at"] for s, r in sweep.by_seed(3).items()} == \
        {s: r["finished_at"] for s, r in records.items()}


def test_scancel_of_a_running_job_records_interrupted_and_a_relaunch_reruns_only_it(tmp_path):
    """Task 0 is the cancelled one: the command still waits for the other two."""
    sweep = Sweep(tmp_path)
    began = time.time()
    process = sweep.start("sweep=seeds3", "pruning=slow_magnitude", slow_seeds="0")
    text = wait_for_log(tmp_path / "multirun" / "0", "slow run: sleeping", process)
    job = re.search(r"SLURM job (\d+_0) ", text).group(1)
    subprocess.run(["scancel", job], check=True)
    _, stderr = process.communicate(timeout=300)
    log.info("sweep with scancel: %.1f s, exit %d", time.time() - began, process.returncode)
    assert process.returncode == 1, stderr[-3000:]
    lines = not_completed_lines(stderr)
    assert len(lines) == 2 and lines[1].strip() == f"seed=0: interrupted (SIGTERM) [SLURM job {job}]", lines
    records = sweep.by_seed(3)
    assert records[0]["status"] == "interrupted" and records[0]["failure"]["stage"] == "allocate"
    assert records[0]["failure"]["message"] == "SIGTERM" and records[0]["environment"]["slurm"]["job"] == job
    assert records[1]["status"] == records[2]["status"] == "completed"  # waited for them
    assert sacct(job)[job]["state"].startswith("CANCELLED")

    submitted = sweep.submissions()
    again = sweep.run("sweep=seeds3", "pruning=slow_magnitude")
    assert again.returncode == 0, again.stderr[-3000:]
    assert len(sweep.submissions()) == len(submitted) + 1  # seed 0 alone
    rerun = sweep.by_seed(3)
    assert rerun[0]["status"] == "completed" and rerun[0]["environment"]["slurm"]["job"] != job
    assert [rerun[s]["finished_at"] for s in (1, 2)] == [records[s]["finished_at"] for s in (1, 2)]


def test_a_job_cancelled_before_it_starts_still_leaves_its_run_a_record(tmp_path):
    """One job at a time: seed 1 waits behind the slow seed 0 and is cancelled while pending; its
    job never runs, so the launching process writes the run's record."""
    sweep = Sweep(tmp_path)
    began = time.time()
    process = sweep.start("-m", "seed=0,1", "pruning=slow_magnitude", "hydra.launcher.array_parallelism=1",
                          slow_seeds="0", slow_s=15)
    text = wait_for_log(tmp_path / "multirun" / "0", "slow run: sleeping", process)
    pending = re.search(r"SLURM job (\d+)_0 ", text).group(1) + "_1"
    subprocess.run(["scancel", pending], check=True)
    _, stderr = process.communicate(timeout=300)
    log.info("sweep with a pending job cancelled: %.1f s, exit %d", time.time() - began, process.returncode)
    assert process.returncode == 1, stderr[-3000:]
    lines = not_completed_lines(stderr)
    assert len(lines) == 2 and lines[1].strip() == \
        f"seed=1: the job ended CANCELLED before it started [SLURM job {pending}]", lines
    records = sweep.by_seed(2)
    assert records[0]["status"] == "completed"
    assert records[1]["status"] == "interrupted" and records[1]["failure"]["stage"] == "job"
    assert records[1]["environment"]["slurm"]["job"] == pending  # the job that never ran it
    array, task = pending.split("_")
    states = sacct(array)  # a task cancelled while pending may still be in the array's record: 8_[1]
    state = (states.get(pending) or states.get(f"{array}_[{task}]") or {}).get("state", "")
    assert state.startswith("CANCELLED"), states

    again = sweep.run("-m", "seed=0,1", "pruning=slow_magnitude")
    assert again.returncode == 0, again.stderr[-3000:]
    rerun = sweep.by_seed(2)
    assert rerun[1]["status"] == "completed" and rerun[0]["finished_at"] == records[0]["finished_at"]


def test_a_job_past_its_time_limit_records_interrupted_and_a_relaunch_reruns_it(tmp_path):
    """submitit asks SLURM for SIGUSR2 signal_delay_s before the limit (SLURM sends it up to a
    minute earlier still): 2 minutes and 10 s put it past the job's start-up."""
    sweep = Sweep(tmp_path)
    limits = ("hydra.launcher.timeout_min=2", "hydra.launcher.signal_delay_s=10")
    result = sweep.run("-m", "seed=0,1", "pruning=slow_magnitude", *limits, slow_seeds="0")
    assert result.returncode == 1, result.stderr[-3000:]
    records = sweep.by_seed(2)
    job = records[0]["environment"]["slurm"]["job"]
    lines = not_completed_lines(result.stderr)
    assert len(lines) == 2 and lines[1].strip() == f"seed=0: interrupted (SIGUSR2) [SLURM job {job}]", lines
    assert records[0]["status"] == "interrupted" and records[0]["failure"]["message"] == "SIGUSR2"
    assert records[0]["failure"]["stage"] == "allocate" and records[1]["status"] == "completed"
    assert "interrupted (SIGUSR2)" in Path(records[0]["environment"]["slurm"]["stdout"]).read_text()
    accounting = sacct(job)[job]
    assert accounting["limit"] == "00:02:00"
    assert accounting["state"] == "COMPLETED"  # it ended itself, record written, before SLURM killed it

    again = sweep.run("-m", "seed=0,1", "pruning=slow_magnitude", *limits)
    assert again.returncode == 0, again.stderr[-3000:]
    rerun = sweep.by_seed(2)
    assert rerun[0]["status"] == "completed" and rerun[1]["finished_at"] == records[1]["finished_at"]


def test_a_failed_run_the_sweep_waits_for_every_job_and_exits_1_naming_it(tmp_path, text_file):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"\x00\x01 not text")
    sweep = Sweep(tmp_path)
    result = sweep.run("-m", "pruning=magnitude", "data=local_text", f"data.calibration.paths=[{text_file}]",
                       "data.calibration.seqlen=32", f"data.eval_paths=[{text_file}],[{bad}]")
    assert result.returncode == 1, result.stderr[-3000:]
    lines = not_completed_lines(result.stderr)
    assert len(lines) == 2 and "1 run(s) of the sweep failed" in lines[0], lines
    assert str(bad) in lines[1] and "DataUnavailableError" in lines[1] and "binary" in lines[1], lines
    records = sweep.records(2)  # one per run: the failed one's written although the run never started
    statuses = sorted((r["status"], (r["failure"] or {}).get("stage")) for r in records.values())
    assert statuses == [("completed", None), ("failed", "setup")]
    jobs = [r["environment"]["slurm"]["job"] for r in records.values()]
    array = jobs[0].split("_")[0]
    assert {row["state"] for row in sacct(array).values()} == {"COMPLETED"}
