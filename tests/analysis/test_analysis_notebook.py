"""notebooks/01_results.ipynb: committed without outputs, and its code runs on CLI output."""

import json
from pathlib import Path

from conftest import PPL

from prunelab.analysis.cli import main

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "01_results.ipynb"


def _notebook() -> dict:
    return json.loads(NOTEBOOK.read_text(encoding="utf-8"))


def test_notebook_is_stripped_nbformat_4():
    notebook = _notebook()
    assert notebook["nbformat"] == 4
    code_cells = [c for c in notebook["cells"] if c["cell_type"] == "code"]
    assert code_cells
    for cell in code_cells:
        assert cell["outputs"] == [] and cell["execution_count"] is None


def test_notebook_code_runs_on_aggregated_results(sweep_dir, tmp_path, monkeypatch):
    results = tmp_path / "results"
    assert main([str(sweep_dir), "--out", str(results / "unit"), "--metric", PPL,
                 "--baseline", "allocation=uniform", "--n-resamples", "99"]) == 0
    monkeypatch.setenv("PRUNELAB_RESULTS", str(results))
    namespace: dict = {}
    for cell in _notebook()["cells"]:
        if cell["cell_type"] == "code":
            exec(compile("".join(cell["source"]), str(NOTEBOOK), "exec"), namespace)
    assert list(namespace["studies"]) == ["unit"]
    assert ("unit", PPL) in namespace["figures"]
