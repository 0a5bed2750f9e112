"""`hydra/launcher=local_parallel` on a GPU machine: each run gets its own GPU(s) through the
`CUDA_VISIBLE_DEVICES` submitit's local executor gives its job (it used to give every job "",
hiding the GPUs), runs queue for a free group, and the CPU behaviour is unchanged."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest

from prunelab.cluster import gpus
from prunelab.errors import ConfigError

PRUNELAB = str(Path(sys.executable).with_name("prunelab"))


def test_visible_gpus_are_the_physical_indices_cuda_visible_devices_names(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert gpus.visible_gpus() == [2, 3]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert gpus.visible_gpus() == []
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,-1,0")  # CUDA ignores everything from a -1 on
    assert gpus.visible_gpus() == [1]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-8c3f2a1e-0000")
    with pytest.raises(ConfigError, match="by UUID"):
        gpus.visible_gpus()


def test_one_gpu_per_run_by_default_none_without_cuda_and_too_many_is_one_line():
    assert gpus.gpus_per_run(None, [0, 1], cuda_available=True) == 1
    assert gpus.gpus_per_run(None, [0, 1], cuda_available=False) == 0  # the CPU behaviour
    assert gpus.gpus_per_run(None, [], cuda_available=False) == 0
    assert gpus.gpus_per_run(0, [0, 1], cuda_available=True) == 0
    assert gpus.gpus_per_run(2, [4, 5, 6], cuda_available=True) == 2
    with pytest.raises(ConfigError, match=r"gpus_per_node=3 GPUs per run, but this process sees 2"):
        gpus.gpus_per_run(3, [0, 1], cuda_available=True)
    assert gpus.gpu_groups([4, 5, 6, 7, 8], 2) == [(4, 5), (6, 7)]


class FakeJob:
    def __init__(self):
        self.finished = False

    def done(self) -> bool:
        return self.finished


def test_a_run_waits_for_a_free_group():
    slots, waits = None, []
    first, second = FakeJob(), FakeJob()

    def sleep(seconds: float) -> None:  # the first job ends while the third run waits
        waits.append(seconds)
        first.finished = True

    slots = gpus.GpuSlots([(0,), (1,)], poll_s=0.5, sleep=sleep)
    a = slots.take()
    slots.give(a, first)
    b = slots.take()
    slots.give(b, second)
    assert (a, b) == ((0,), (1,)) and waits == []
    assert slots.take() == (0,) and waits == [0.5]  # the first job's GPU, once it was done


def sweep(tmp_path: Path, model_dir: Path, text: Path, launcher_gpus: str, visible: str,
          seeds: str = "0,1,2") -> list[dict]:
    command = [PRUNELAB, "-m", f"seed={seeds}", "hydra/launcher=local_parallel",
               f"hydra.launcher.gpus_per_node={launcher_gpus}", f"hydra.sweep.dir={tmp_path / 'multirun'}",
               f"model.name_or_path={model_dir}", "model.device=cpu", "data=local_text",
               f"data.calibration.paths=[{text}]", f"data.eval_paths=[{text}]", "data.calibration.nsamples=4",
               "data.calibration.seqlen=16", "evaluation=ppl", "evaluation.perplexity.seqlen=16",
               "pruning=magnitude", "tracking=none", "runtime.progress=false", "runtime.threads=1",
               f"paths.records_dir={tmp_path / 'records'}", f"paths.cache_dir={tmp_path / 'cache'}"]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": visible}
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return [json.loads(p.read_text()) for p in sorted((tmp_path / "records").glob("*/seed*/result.json"))]


def test_each_local_run_gets_its_own_gpu_and_runs_queue_for_one(tiny_model_dirs, text_file, tmp_path):
    """Three runs on GPUs 0 and 1: each run sees exactly one of them, and two runs that ran at the
    same time never saw the same one (the third waited for a free GPU)."""
    records = sweep(tmp_path, tiny_model_dirs["llama"], text_file, "1", "0,1")
    assert len(records) == 3 and all(r["status"] == "completed" for r in records)
    seen = [r["environment"]["hardware"]["cuda_visible_devices"] for r in records]
    assert set(seen) <= {"0", "1"}, seen

    def span(record: dict) -> tuple[datetime, datetime]:
        return datetime.fromisoformat(record["started_at"]), datetime.fromisoformat(record["finished_at"])

    for i, a in enumerate(records):
        for b in records[i + 1:]:
            (a0, a1), (b0, b1) = span(a), span(b)
            if a0 < b1 and b0 < a1:  # ran at the same time
                assert a["environment"]["hardware"]["cuda_visible_devices"] != \
                    b["environment"]["hardware"]["cuda_visible_devices"]


def test_without_gpus_local_runs_see_none_as_before(tiny_model_dirs, text_file, tmp_path):
    records = sweep(tmp_path, tiny_model_dirs["llama"], text_file, "null", "", seeds="0,1")
    assert [r["environment"]["hardware"]["cuda_visible_devices"] for r in records] == ["", ""]
