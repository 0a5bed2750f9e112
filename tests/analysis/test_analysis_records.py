"""Loading result.json records: failed/unreadable/duplicate handling, the flat frame, W&B."""

import json
import logging
import shutil
from types import SimpleNamespace

import pandas as pd
import pytest
from conftest import ACC, MODEL, PPL, dense_metrics, labels_for, signature_for, write_record

from prunelab.analysis import records


def test_failed_and_unreadable_records_are_excluded_and_counted(study_dir, caplog):
    write_record(study_dir, signature_for("broken"), 0, labels_for("owl", 0.5), None,
                 status="failed")
    write_record(study_dir, signature_for("cut"), 0, labels_for("owl", 0.7), None,
                 status="interrupted")  # a SLURM time limit: excluded like a failed run, not unreadable
    (study_dir / "junk" / "seed0").mkdir(parents=True)
    (study_dir / "junk" / "seed0" / "result.json").write_text("{not json")
    (study_dir / "old" / "seed0").mkdir(parents=True)
    (study_dir / "old" / "seed0" / "result.json").write_text(json.dumps({"schema_version": 0}))
    with caplog.at_level(logging.WARNING, logger="prunelab.analysis"):
        loaded = records.load_records([study_dir])
    assert len(loaded.completed) == 6 and len(loaded.failed) == 2
    assert len(loaded.unreadable) == 2
    skipped = [r.getMessage() for r in caplog.records if r.getMessage().startswith("skipping")]
    assert len(skipped) == 2 and all("\n" not in line for line in skipped)
    assert any("excluded 2 failed run" in r.getMessage() for r in caplog.records)
    frame = records.records_to_frame(loaded)
    assert set(frame["status"]) == {"completed"} and len(frame) == 6 * 2


def test_copies_of_a_run_are_counted_once(study_dir, tmp_path):
    # Hydra's output folder keeps a copy of each record next to records/.
    copy = tmp_path / "outputs" / "2025-01-01" / "12-00-00"
    shutil.copytree(study_dir, copy)
    loaded = records.load_records([tmp_path])
    assert len(loaded.completed) == 6 and loaded.duplicates == 6


def test_frame_has_labels_metric_values_samples_and_stamp(study_dir):
    frame = records.records_to_frame(records.load_records([study_dir]))
    for column in ("signature", "seed", "study", "labels.model", "labels.allocation", "metric",
                   "value", "stamp", "protocol", "samples", "dense_value"):
        assert column in frame.columns
    row = frame[(frame["metric"] == PPL)].iloc[0]
    assert row["labels.model"] == MODEL
    assert len(row["samples"]["values"]) == row["protocol"]["windows"]
    assert json.loads(row["stamp"])["seqlen"] == 128
    assert row["dense_value"] == pytest.approx(dense_metrics()[PPL]["value"])
    assert sorted(frame["metric"].unique()) == sorted([PPL, ACC])


def test_wandb_without_credentials_fails_clearly_and_offline(tmp_path, monkeypatch):
    for name in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE", "NETRC"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    monkeypatch.setenv("WANDB_MODE", "offline")
    with pytest.raises(records.WandbCredentialsError) as error:
        records.load_wandb_runs("some-project")
    message = str(error.value)
    assert "WANDB_API_KEY" in message and "\n" not in message


def test_wandb_runs_become_the_same_records():
    finished = SimpleNamespace(
        id="run1", state="finished", files=lambda: [],
        config={"seed": 3, "signature": "abcdefabcdefabcd", "labels": {"model": MODEL}},
        summary={PPL: 12.5, "dense/" + PPL: 5.5, "_runtime": 10, "note": "x"})
    running = SimpleNamespace(id="run2", state="running", files=lambda: [], config={}, summary={})
    api = SimpleNamespace(runs=lambda path, filters=None: [finished, running])
    loaded = records.load_wandb_runs("proj", entity="team", api=api)
    assert len(loaded.completed) == 1
    frame = records.records_to_frame(loaded)
    row = frame.iloc[0]
    assert (row["signature"], row["seed"], row["metric"]) == ("abcdefabcdefabcd", 3, PPL)
    assert (row["value"], row["dense_value"]) == (12.5, 5.5)
    assert row["source"] == "wandb:team/proj/run1"


def test_log_table_to_wandb_in_disabled_mode(tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = wandb.init(mode="disabled", project="prunelab-test")
    try:
        frame = pd.DataFrame({"setting": ["a", "b"], "mean": [1.0, float("nan")],
                              "protocol": [{"seqlen": 128}, None]})
        table = records.log_table_to_wandb(frame, run=run, key="summary")
    finally:
        run.finish()
    assert table.columns == ["setting", "mean", "protocol"]
    assert table.data[1] == ["b", None, None]
    assert table.data[0][2] == '{"seqlen": 128}'
