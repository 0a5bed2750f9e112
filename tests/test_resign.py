"""Re-signing records: a seed folder whose config hashes to another signature moves there whole."""

from __future__ import annotations

import json

import pytest

from prunelab.errors import StorageError
from prunelab.tracking.lease import LEASE_NAME
from prunelab.tracking.record import config_signature, write_record
from prunelab.tracking.resign import main, resign

CONFIG = {"pruning": {"sparsity": 0.5}, "evaluation": {"zeroshot": {"tasks": ["rt_lastword"], "scorer": "lm_eval"}}}


def _record(records, folder, seed=0, config=CONFIG, name="result.json"):
    return write_record(records / folder / f"seed{seed}" / name,
                        {"status": "completed", "signature": folder, "seed": seed, "config": config})


def test_a_stale_folder_moves_to_its_signature_with_the_records_beside_it(tmp_path):
    _record(tmp_path, "stale", seed=5)
    _record(tmp_path, "stale", seed=5, name="result.interrupted-1.json")
    right = config_signature(CONFIG)
    _record(tmp_path, right, seed=0)
    assert main([str(tmp_path), "--dry-run"]) == 0 and (tmp_path / "stale").exists()
    moves = resign(tmp_path)
    assert moves == [(tmp_path / "stale" / "seed5", tmp_path / right / "seed5")]
    assert not (tmp_path / "stale").exists()
    for name in ("result.json", "result.interrupted-1.json"):
        assert json.loads((tmp_path / right / "seed5" / name).read_text())["signature"] == right
    assert resign(tmp_path) == []


def test_nothing_moves_when_a_target_exists_or_a_run_holds_a_lease(tmp_path):
    right = config_signature(CONFIG)
    _record(tmp_path, "stale", seed=0)
    _record(tmp_path, "stale", seed=1)
    _record(tmp_path, right, seed=1)
    with pytest.raises(StorageError, match="a record of that setting and seed is there"):
        resign(tmp_path)
    assert (tmp_path / "stale" / "seed0" / "result.json").exists()
    (tmp_path / right / "seed1" / "result.json").unlink()
    (tmp_path / right / "seed1").rmdir()
    (tmp_path / "stale" / "seed1" / LEASE_NAME).write_text("{}")
    assert main([str(tmp_path)]) == 1
    assert sorted(p.name for p in (tmp_path / "stale").iterdir()) == ["seed0", "seed1"]


def test_a_missing_folder_or_two_folders_for_one_target_is_a_one_line_error(tmp_path, capsys):
    assert main([str(tmp_path / "nowhere")]) == 1
    assert "is not a folder of records" in capsys.readouterr().err
    _record(tmp_path, "stale_a", seed=0)
    _record(tmp_path, "stale_b", seed=0)
    with pytest.raises(StorageError, match="would receive 2 folders"):
        resign(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["stale_a", "stale_b"]
