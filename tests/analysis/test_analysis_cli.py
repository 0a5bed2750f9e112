"""prunelab-aggregate end to end, called as main([...])."""

import shutil

import pytest
from conftest import ACC, PPL, labels_for, signature_for, write_record

from prunelab.analysis import tables
from prunelab.analysis.cli import main


def test_writes_tables_and_plots_and_prints_markdown(sweep_dir, tmp_path, capsys):
    write_record(sweep_dir, signature_for("crashed"), 0, labels_for("owl", 0.5), None,
                 status="failed")
    out = tmp_path / "results" / "unit"
    code = main([str(sweep_dir), "--out", str(out), "--metric", PPL, "--baseline",
                 "allocation=uniform", "--pivot", "allocation,sparsity", "--n-resamples", "199"])
    captured = capsys.readouterr()
    assert code == 0
    for name in ("table.md", "table.tex", "table.csv", "ppl-testbed-token_vs_sparsity.png",
                 "layer_sparsity.png", "layer_scores.png",
                 "pivot_sparsity_ppl-testbed-token.md", "pivot_sparsity_ppl-testbed-token.tex"):
        assert (out / name).stat().st_size > 0, name
    assert (out / "table.md").read_text() in captured.out
    assert "1 failed run(s) excluded" in captured.err
    summary = tables.read_summary_csv(out / "table.csv")
    assert set(summary["metric"]) == {PPL} and len(summary) == 5  # dense + 4 settings
    assert "owl" not in set(summary["labels.allocation"].dropna())


def test_format_selection_and_no_plots(study_dir, tmp_path):
    out = tmp_path / "out"
    assert main([str(study_dir), "--out", str(out), "--format", "csv", "--no-plots"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["table.csv"]


@pytest.mark.parametrize("arguments, message", [
    (["--metric", "ppl/wikitext2/token"], f"available: {PPL}, {ACC}"),
    (["--baseline", "allocation=owl"], "unknown baseline 'allocation=owl'"),
    (["--baseline", "colour=red"], "unknown label 'colour'"),
    (["--format", "docx"], "unknown --format docx"),
])
def test_user_errors_exit_2_with_one_line(study_dir, tmp_path, capsys, arguments, message):
    code = main([str(study_dir), "--out", str(tmp_path / "out"), *arguments])
    error_lines = [l for l in capsys.readouterr().err.splitlines() if "error:" in l]
    assert code == 2 and len(error_lines) == 1 and message in error_lines[0]


def test_no_records_exits_2(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main([str(tmp_path / "empty"), "--out", str(tmp_path / "out")]) == 2
    assert "no completed records found" in capsys.readouterr().err


def test_compare_two_runs(study_dir, tmp_path, capsys):
    pals = study_dir / signature_for("pals0.5") / "seed0"
    uniform = study_dir / signature_for("uniform0.5") / "seed0" / "result.json"
    code = main(["--compare", str(pals), str(uniform), "--out", str(tmp_path / "cmp"),
                 "--n-resamples", "199"])
    output = capsys.readouterr().out
    assert code == 0
    assert "paired bootstrap over windows" in output and "McNemar (exact binomial)" in output
    assert (tmp_path / "cmp" / "compare.csv").exists()
    assert main(["--compare", str(pals), str(tmp_path / "missing")]) == 2


def test_default_out_is_results_study(study_dir, tmp_path, monkeypatch):
    shutil.copytree(study_dir, tmp_path / "work" / "records")
    monkeypatch.chdir(tmp_path / "work")
    assert main(["records", "--no-plots", "--n-resamples", "99"]) == 0
    assert (tmp_path / "work" / "results" / "unit" / "table.md").exists()


def test_wandb_project_without_credentials_is_a_one_line_error(tmp_path, monkeypatch, capsys):
    for name in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE", "NETRC"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    assert main(["--wandb-project", "prunelab", "--out", str(tmp_path / "out")]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and "no W&B API key" in error[0]
