"""notebooks/01_results.ipynb: committed without outputs, executes on the committed results (real
model tables included) without a cell error, and copes with a study being re-run."""

import json
import shutil
import time
from pathlib import Path

import nbformat
from conftest import PPL
from nbclient import NotebookClient

from prunelab.analysis import studies
from prunelab.analysis.cli import main

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "notebooks" / "01_results.ipynb"
RESULTS = ROOT / "results"


def _notebook() -> dict:
    return json.loads(NOTEBOOK.read_text(encoding="utf-8"))


def _run_in_process(results: Path, monkeypatch) -> dict:
    """Run the notebook's code cells in this process (fast) against `results`."""
    monkeypatch.setenv("PRUNELAB_RESULTS", str(results))
    namespace: dict = {}
    for cell in _notebook()["cells"]:
        if cell["cell_type"] == "code":
            exec(compile("".join(cell["source"]), str(NOTEBOOK), "exec"), namespace)
    return namespace


def test_notebook_is_stripped_nbformat_4():
    notebook = _notebook()
    assert notebook["nbformat"] == 4
    code_cells = [c for c in notebook["cells"] if c["cell_type"] == "code"]
    assert code_cells
    for cell in code_cells:
        assert cell["outputs"] == [] and cell["execution_count"] is None


def test_notebook_executes_on_the_committed_results(monkeypatch):
    """nbclient runs every cell in a real kernel from notebooks/ (as `jupyter nbconvert --execute`
    does); any cell error raises CellExecutionError and fails the test."""
    monkeypatch.delenv("PRUNELAB_RESULTS", raising=False)
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    started = time.monotonic()
    NotebookClient(notebook, timeout=120, kernel_name="python3",
                   resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()
    assert time.monotonic() - started < 60
    shown = "".join(output.get("data", {}).get("text/markdown", "")
                    for cell in notebook.cells for output in cell.get("outputs", []))
    for table in studies.find_tables(RESULTS):  # every study's paper table, smollm2 ones too
        assert f"### {table.name}\n" in shown, table.name
    assert any(t.name.endswith("/smollm2") for t in studies.find_tables(RESULTS))
    images = [output for cell in notebook.cells for output in cell.get("outputs", [])
              if "image/png" in output.get("data", {})]
    assert images


def test_notebook_runs_on_aggregated_synthetic_results(sweep_dir, tmp_path, monkeypatch):
    results = tmp_path / "results"
    assert main([str(sweep_dir), "--out", str(results / "unit"), "--metric", PPL,
                 "--baseline", "allocation=uniform", "--n-resamples", "99"]) == 0
    namespace = _run_in_process(results, monkeypatch)
    assert list(namespace["summaries"]) == ["unit"]
    assert "unit" in namespace["figures"]


def test_notebook_copes_with_missing_and_half_written_model_folders(tmp_path, monkeypatch):
    results = tmp_path / "results"
    for study in ("ghosted", "wrp"):
        shutil.copytree(RESULTS / study, results / study,
                        ignore=shutil.ignore_patterns("records*", "*.png"))
    shutil.rmtree(results / "wrp" / "smollm2")          # being re-run: gone
    half = results / "ghosted" / "smollm2"
    (half / "table.csv").write_text("setting,labels.model\n")   # half written: no rows yet
    (results / "pals" / "smollm2").mkdir(parents=True)   # only a folder, no tables
    namespace = _run_in_process(results, monkeypatch)
    assert sorted(namespace["summaries"]) == ["ghosted", "wrp"]
    assert namespace["waiting"] == ["wrp"]


def test_notebook_shows_real_model_tables_once_they_are_back(tmp_path, monkeypatch):
    """pals and wanda_sparsegpt come back with results/<study>/smollm2/ laid out as ghosted's:
    the old (pre-faithful) tables stand in for them here, read-only."""
    results = tmp_path / "results"
    for study in ("pals", "wanda_sparsegpt"):
        shutil.copytree(RESULTS / study, results / study,
                        ignore=shutil.ignore_patterns("records*", "smollm2*", "*.png"))
        shutil.copytree(RESULTS / study / "smollm2_pre_faithful", results / study / "smollm2",
                        ignore=shutil.ignore_patterns("*.png"))
    namespace = _run_in_process(results, monkeypatch)
    assert sorted(namespace["summaries"]) == ["pals", "pals/smollm2", "wanda_sparsegpt",
                                              "wanda_sparsegpt/smollm2"]
    assert sorted(namespace["figures"]) == sorted(namespace["summaries"])
    assert namespace["waiting"] == []
