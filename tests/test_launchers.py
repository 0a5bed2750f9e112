"""prunelab's launchers without a cluster: checks before submission, outcomes of launched jobs
(local processes), the end-of-allocation signals, and the SLURM job a record names. The same
behaviour on a real SLURM cluster: tests/test_cluster.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from prunelab.cluster import checks
from prunelab.cluster.launcher import last_error_line, run_labels
from prunelab.errors import ConfigError, RunInterrupted
from prunelab.interrupts import catch_termination
from prunelab.tracking.environment import slurm_job

PRUNELAB = str(Path(sys.executable).with_name("prunelab"))


def test_the_gpu_preset_needs_a_partition_and_gpus_one_line_before_submission(tmp_path):
    result = subprocess.run([PRUNELAB, "sweep=seeds3", "hydra/launcher=slurm", "tracking=none",
                             f"hydra.sweep.dir={tmp_path / 'multirun'}"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 2
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("prunelab: error: hydra/launcher=slurm needs hydra.launcher.partition=")
    assert "hydra.launcher.gpus_per_node=" in line and "hydra/launcher=slurm_cpu" in line
    assert not (tmp_path / "multirun" / ".submitit").exists()


def test_gpu_requests_count_in_any_form():
    checks.check_gpu_request({"partition": "gpu", "gpus_per_node": 1})
    checks.check_gpu_request({"partition": "gpu", "gres": "gpu:a100:2"})
    checks.check_gpu_request({"partition": "gpu", "additional_parameters": {"gpus": 4}})
    with pytest.raises(ConfigError, match="partition=<GPU partition>$|partition=<GPU partition> \\("):
        checks.check_gpu_request({"gpus_per_node": 1})


def test_slurm_must_answer_before_submission(monkeypatch):
    monkeypatch.setattr(checks.shutil, "which", lambda name: None)
    with pytest.raises(ConfigError, match="sbatch, srun, sacct not found.*local_parallel"):
        checks.check_slurm_reachable()
    monkeypatch.setattr(checks.shutil, "which", lambda name: f"/usr/bin/{name}")
    disabled = subprocess.CompletedProcess([], 1, "", "sacct: error: Slurm accounting storage is disabled\n")
    monkeypatch.setattr(checks.subprocess, "run", lambda *a, **k: disabled)
    with pytest.raises(ConfigError, match=r"sacct fails \(sacct: error: Slurm accounting storage is disabled\)"):
        checks.check_slurm_reachable()


def test_sbatch_refusals_get_their_fix():
    gres = checks.submission_error("sbatch: error: Invalid generic resource (gres) specification\n")
    assert str(gres).startswith("sbatch refused the sweep's jobs: Invalid generic resource") and "slurm_cpu" in str(gres)
    memory = checks.submission_error("sbatch: error: Memory specification can not be satisfied\n"
                                     "sbatch: error: Batch job submission failed: Requested node configuration")
    assert "Memory specification" in str(memory) and "mem_gb" in str(memory)


def test_runs_are_labelled_by_what_tells_them_apart():
    assert run_labels([["a=1", "seed=0"], ["a=1", "seed=1"]]) == ["seed=0", "seed=1"]
    assert run_labels([["a=1", "seed=0"]]) == ["a=1 seed=0"]
    trace = ("Job (task=0) failed during processing with trace:\n----------------------\nTraceback (most "
             "recent call last):\n  File \"x\", line 1\nsubmitit.core.utils.UncompletedJobError: Job not "
             "requeued because: checkpoint function returned None.\n----------------------\nYou can check")
    assert last_error_line(trace).startswith("submitit.core.utils.UncompletedJobError: Job not requeued")


def test_sigusr2_and_sigterm_interrupt_once_while_the_record_is_written():
    before = signal.getsignal(signal.SIGTERM)
    with catch_termination():
        with pytest.raises(RunInterrupted) as caught:
            os.kill(os.getpid(), signal.SIGUSR2)
        assert caught.value.signal_name == "SIGUSR2"
        os.kill(os.getpid(), signal.SIGTERM)  # SLURM's second SIGTERM: logged, ignored
    assert signal.getsignal(signal.SIGTERM) == before
    with catch_termination(), pytest.raises(RunInterrupted, match="SIGTERM"):  # a new block: armed again
        os.kill(os.getpid(), signal.SIGTERM)


def test_a_record_names_its_slurm_job(monkeypatch):
    for var in [v for v in os.environ if v.startswith("SLURM") or v == "SUBMITIT_FOLDER"]:
        monkeypatch.delenv(var)
    assert slurm_job() is None
    monkeypatch.setenv("SLURM_JOB_ID", "12")
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "10")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "2")
    monkeypatch.setenv("SLURM_JOB_PARTITION", "cpu")
    monkeypatch.setenv("SUBMITIT_FOLDER", "/sweep/.submitit/%j")
    job = slurm_job()
    assert (job["job"], job["job_id"], job["array_task_id"], job["partition"]) == ("10_2", "12", "2", "cpu")
    assert job["stdout"] == "/sweep/.submitit/10_2/10_2_0_log.out"


def test_a_failed_launched_run_exits_1_every_run_has_a_record_and_a_relaunch_skips_the_rest(
        tiny_model_dirs, text_file, tmp_path):
    """Launched jobs (local processes here) cannot add to the launching process's list of failed
    runs: their outcomes come back and the command exits 1 naming the failed run."""
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"\x00binary")
    command = [PRUNELAB, "-m", "hydra/launcher=local_parallel", f"hydra.sweep.dir={tmp_path / 'multirun'}",
               f"model.name_or_path={tiny_model_dirs['llama']}", "model.device=cpu", "data=local_text",
               f"data.calibration.paths=[{text_file}]", f"data.eval_paths=[{text_file}],[{bad}]",
               "data.calibration.nsamples=4", "data.calibration.seqlen=16", "evaluation=ppl",
               "evaluation.perplexity.seqlen=16", "pruning=magnitude", "tracking=none",
               "runtime.progress=false", "runtime.threads=1", f"paths.records_dir={tmp_path / 'records'}",
               f"paths.cache_dir={tmp_path / 'cache'}"]
    first = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert first.returncode == 1, first.stderr[-3000:]
    assert "Traceback" not in first.stderr
    header, line = first.stderr.strip().splitlines()[-2:]
    assert "1 run(s) of the sweep failed" in header
    assert line.strip().startswith(f"data.eval_paths=[{bad}]: DataUnavailableError")
    records = [json.loads(p.read_text()) for p in (tmp_path / "records").glob("*/seed0/result*.json")]
    assert sorted((r["status"], (r["failure"] or {}).get("stage")) for r in records) == \
        [("completed", None), ("failed", "setup")]

    again = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert again.returncode == 1 and "completed already, not submitted" in again.stdout + again.stderr
    assert len(list((tmp_path / "records").glob("*/seed0/result*.json"))) == 2
