"""Sweeps: seeds x settings through submitit, killed part way, resumed, aggregated with p-values."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from hydra import compose, initialize_config_dir
from scipy import stats

from prunelab.cli import CONF_DIR

SETTINGS = "pruning=magnitude,wanda"  # Wanda depends on the calibration seed, magnitude does not


def test_slurm_launcher_composes_with_cluster_settings():
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", return_hydra_config=True, overrides=[
            "sweep=seeds9", "hydra/launcher=slurm", "hydra.launcher.partition=gpu",
            "hydra.launcher.gpus_per_node=2", "hydra.launcher.timeout_min=600", "hydra.launcher.mem_gb=128"])
    launcher = cfg.hydra.launcher
    assert launcher._target_.endswith("SlurmLauncher")
    assert (launcher.partition, launcher.gpus_per_node, launcher.timeout_min, launcher.mem_gb) == ("gpu", 2, 600, 128)
    assert cfg.hydra.sweeper.params.seed == "0,1,2,3,4,5,6,7,8"


def sweep_command(model_dir: Path, text: Path, tmp: Path) -> list[str]:
    return [sys.executable, "-m", "prunelab.cli", "sweep=seeds3", SETTINGS, "model.label=tiny_llama",
            "hydra/launcher=local_parallel", f"hydra.sweep.dir={tmp / 'multirun'}",
            f"model.name_or_path={model_dir}", "model.device=cpu", "data=local_text",
            f"data.calibration.paths=[{text}]", f"data.eval_paths=[{text}]", "data.calibration.nsamples=4",
            "data.calibration.seqlen=16", "evaluation=ppl", "evaluation.perplexity.seqlen=16",
            "tracking=none", "runtime.progress=false", "runtime.threads=1",
            f"paths.records_dir={tmp / 'records'}", f"paths.cache_dir={tmp / 'cache'}"]


def completed(records: Path) -> dict[str, dict]:
    out = {}
    for path in records.glob("*/seed*/result.json"):
        record = json.loads(path.read_text())  # never half-written: this must always parse
        if record["status"] == "completed":
            out[str(path)] = record
    return out


def kill_tree(process: subprocess.Popen) -> None:
    parent = psutil.Process(process.pid)
    for proc in [*parent.children(recursive=True), parent]:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    process.wait(timeout=30)


def test_sweep_is_killed_part_way_resumes_and_aggregates(tiny_model_dirs, text_file, tmp_path):
    command = sweep_command(tiny_model_dirs["llama"], text_file, tmp_path)
    env = {**os.environ, "HYDRA_FULL_ERROR": "1"}
    first = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    deadline = time.time() + 400
    while not completed(tmp_path / "records") and time.time() < deadline and first.poll() is None:
        time.sleep(0.05)
    kill_tree(first)
    before = completed(tmp_path / "records")
    assert 1 <= len(before) < 6, f"{len(before)} runs completed before the kill"

    second = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stderr[-3000:]
    after = completed(tmp_path / "records")
    assert len(after) == 6
    for path, record in before.items():  # finished runs were skipped, not recomputed
        assert after[path]["finished_at"] == record["finished_at"]

    from prunelab.analysis.cli import main as aggregate

    out = tmp_path / "table"
    assert aggregate([str(tmp_path / "records"), "--out", str(out), "--baseline",
                      "method=magnitude", "--metric", "ppl/local_text/token", "--no-plots"]) == 0
    assert (out / "table.md").exists() and (out / "table.tex").exists()

    import pandas as pd

    table = pd.read_csv(out / "table.csv")
    row = table[(table["labels.method"] == "wanda") & table["p_t"].notna()].iloc[0]
    by_setting: dict[str, dict[int, float]] = {}
    for record in after.values():
        value = record["metrics"]["pruned"]["ppl/local_text/token"]["value"]
        by_setting.setdefault(record["labels"]["method"], {})[record["seed"]] = value
    seeds = sorted(by_setting["wanda"])
    wanda = [by_setting["wanda"][s] for s in seeds]
    magnitude = [by_setting["magnitude"][s] for s in seeds]
    assert len(set(wanda)) == 3  # the calibration seed changes Wanda's masks
    assert row["p_t"] == pytest.approx(stats.ttest_rel(wanda, magnitude).pvalue, rel=1e-9)
    assert row["p_wilcoxon"] == pytest.approx(stats.wilcoxon(wanda, magnitude).pvalue, rel=1e-9)
