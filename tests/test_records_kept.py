"""Issue 13, items 2 and 5: records are never lost, interruptions are recorded, a full disk leaves
no half-written model, and save_model=true on a completed setting saves the model."""

from __future__ import annotations

import errno
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_cli import compose_config, tiny_run_overrides

from prunelab import pipeline
from prunelab.cli import build_setup
from prunelab.errors import RunInterrupted, StorageError
from prunelab.files import check_writable
from prunelab.tracking.keep import write_keeping_completed
from prunelab.tracking.saved_model import save_model_folder


def test_a_failed_rerun_is_kept_beside_the_completed_record(tmp_path):
    path = tmp_path / "seed0" / "result.json"
    write_keeping_completed(path, {"status": "completed", "n": 1})
    aside = write_keeping_completed(path, {"status": "interrupted", "n": 2})
    assert json.loads(path.read_text())["n"] == 1
    assert aside != path and aside.name.startswith("result.interrupted-")
    assert json.loads(aside.read_text())["n"] == 2
    write_keeping_completed(path, {"status": "completed", "n": 3})  # a completed rerun replaces...
    assert json.loads(path.read_text())["n"] == 3
    previous = list(path.parent.glob("result.previous-*.json"))  # ...and keeps the earlier one
    assert [json.loads(p.read_text())["n"] for p in previous] == [1]
    assert not list(path.parent.glob(".*tmp"))


def test_an_unwritable_records_folder_fails_before_the_model_loads(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    with pytest.raises(StorageError, match="not writable"):
        check_writable(blocker / "records", "the records folder")


def test_a_full_disk_leaves_no_half_written_model_folder(tmp_path):
    def fill_disk(model, folder):
        (Path(folder) / "model.safetensors").write_bytes(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(StorageError, match="no space left"):
        save_model_folder(object(), None, tmp_path / "model", fill_disk)
    assert list(tmp_path.iterdir()) == []


def _setup(tiny_model_dirs, text_file, tmp_path, *extra):
    overrides = tiny_run_overrides(tiny_model_dirs["llama"], text_file, tmp_path)
    return build_setup(compose_config(overrides + ["pruning=magnitude", "evaluation=ppl", *extra]))


def test_an_interrupted_rerun_keeps_the_completed_record(tiny_model_dirs, text_file, tmp_path, monkeypatch):
    setup = _setup(tiny_model_dirs, text_file, tmp_path, "runtime.skip_completed=false")
    first = pipeline.run(setup)

    def sigterm(self, ctx, scores):
        raise RunInterrupted("SIGTERM")

    monkeypatch.setattr(type(setup.pruning), "prune", sigterm)
    with pytest.raises(RunInterrupted):
        pipeline.run(setup)
    assert json.loads(setup.record_file.read_text())["finished_at"] == first["finished_at"]
    [aside] = setup.record_file.parent.glob("result.interrupted-*.json")
    record = json.loads(aside.read_text())
    assert record["status"] == "interrupted" and record["failure"]["stage"] == "prune"


def test_save_model_on_a_completed_setting_saves_it(tiny_model_dirs, text_file, tmp_path):
    first = pipeline.run(_setup(tiny_model_dirs, text_file, tmp_path))
    assert "saved_model" not in first
    setup = _setup(tiny_model_dirs, text_file, tmp_path, "save_model=true")
    record = pipeline.run(setup)
    assert record["status"] == "completed" and Path(record["saved_model"], "model.safetensors").exists()
    assert len(list(setup.record_file.parent.glob("result.previous-*.json"))) == 1
    again = pipeline.run(setup)  # now saved: skipped
    assert again["finished_at"] == record["finished_at"]


SLOW_SCORE = ("import time, sys; from prunelab.pruning.magnitude import Magnitude; "
              "Magnitude.allocate = lambda self, ctx: time.sleep(600); "
              "from prunelab.cli import main; sys.argv[0] = 'prunelab'; main()")


def test_sigterm_ends_the_run_with_an_interrupted_record_and_one_line(tiny_model_dirs, text_file, tmp_path):
    args = tiny_run_overrides(tiny_model_dirs["llama"], text_file, tmp_path) + [
        "pruning=magnitude", "evaluation=ppl", f"hydra.run.dir={tmp_path / 'out'}"]
    process = subprocess.Popen([sys.executable, "-c", SLOW_SCORE, *args], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    deadline = time.time() + 240
    while time.time() < deadline and not any("stage allocate" in p.read_text()
                                              for p in (tmp_path / "out").glob("*.log")):
        time.sleep(0.2)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 143, stderr[-2000:]
    assert "Traceback" not in stderr and "interrupted (SIGTERM)" in stderr.strip().splitlines()[-1]
    [path] = (tmp_path / "records").glob("*/seed0/result.json")
    record = json.loads(path.read_text())
    assert record["status"] == "interrupted" and record["failure"]["stage"] == "allocate"
