"""The paper-table preset and the md/tex renderers (tabulate, pandas Styler)."""

import pandas as pd
import pytest
from conftest import ACC, PPL, markdown_header

from prunelab.analysis import paper, records, render, tables
from prunelab.analysis.cli import main

PPL_50, PPL_70 = "PPL (testbed) ↓ · 50%", "PPL (testbed) ↓ · 70%"
ACC_50 = "boolq ↑ · 50%"


def _summary(root, metrics=(PPL, ACC)):
    frame = records.records_to_frame(records.load_records([root]))
    return tables.build_summary(frame, list(metrics))


def _mean(summary, allocation, sparsity, metric):
    row = summary[(summary["labels.allocation"] == allocation)
                  & (summary["labels.sparsity"] == sparsity) & (summary["metric"] == metric)]
    return row.iloc[0]


def test_methods_as_rows_settings_as_columns_mean_std_cells(sweep_dir):
    summary = _summary(sweep_dir)
    table = paper.paper_table(summary, ["allocation"], "sparsity")
    cells = table.cells.set_index("Allocation")
    assert list(cells.index) == ["dense", "pals", "uniform"]
    assert list(cells.columns) == [PPL_50, PPL_70, ACC_50, "boolq ↑ · 70%"]
    pals = _mean(summary, "pals", 0.7, PPL)
    assert cells.loc["pals", PPL_70] == f"{pals['mean']:.2f} ± {pals['std']:.2f}"
    assert "±" not in cells.loc["dense", PPL_50]      # the dense model is a single value
    assert "3 seeds" in table.caption and "Perplexity (testbed text, token)" in table.caption


def test_best_of_each_column_in_its_own_direction(sweep_dir):
    summary = _summary(sweep_dir)
    table = paper.paper_table(summary, ["allocation"], "sparsity")
    best = table.best.set_index(table.cells["Allocation"])
    # PALS has the lower perplexity (conftest), and lower is better for perplexity.
    assert best.loc["pals", PPL_50] and not best.loc["uniform", PPL_50]
    assert not best.loc["dense"].any()                 # the reference is never "best"
    pals, uniform = (_mean(summary, a, 0.5, ACC)["mean"] for a in ("pals", "uniform"))
    assert best.loc["pals", ACC_50] == (round(pals, 3) >= round(uniform, 3))


def test_markdown_bold_and_latex_booktabs_with_grouped_headers(sweep_dir):
    table = paper.paper_table(_summary(sweep_dir), ["allocation"], "sparsity")
    markdown = paper.paper_markdown(table)
    assert markdown_header(markdown) == ["Allocation", PPL_50, PPL_70, ACC_50, "boolq ↑ · 70%"]
    assert "**" in markdown and markdown.startswith("Mean ± std over 3 seeds")
    latex = paper.paper_latex(table)
    assert "\\toprule" in latex and "\\bottomrule" in latex and "\\bfseries" in latex
    assert "\\multicolumn{2}{c}{PPL (testbed) $\\downarrow$}" in latex
    body = "\n".join(line for line in latex.splitlines() if not line.startswith("%"))
    assert "$\\pm$" in body and "±" not in body      # the caption is a comment above


def test_default_layout_picks_the_numeric_setting_as_columns(sweep_dir):
    assert paper.default_layout(_summary(sweep_dir)) == (["labels.allocation"], "labels.sparsity")


def test_setting_text():
    assert paper.setting_text("labels.sparsity", 0.5) == "50%"
    assert paper.setting_text("labels.layers_removed", 4.0) == "4 layers"
    assert paper.setting_text("labels.sparsity_type", "2:4") == "2:4"


def test_markdown_through_tabulate_escapes_pipes_and_aligns_numbers():
    table = pd.DataFrame({"name": ["a|b", "c"], "value": ["1.5 ± 0.1", "<0.001"]})
    text = render.to_markdown(table, ["a note"])
    lines = text.splitlines()
    assert markdown_header(text) == ["name", "value"]
    assert lines[1].startswith("|:") and lines[1].endswith(":|")   # left text, right numbers
    assert "a\\|b" in text and text.endswith("- a note\n")


def test_latex_through_styler_escapes_and_rules_between_models():
    table = pd.DataFrame({"model": ["m_1", "m_1", "m_2"], "x": ["50%", "a & b", "<0.001"]})
    latex = render.to_latex(table)
    assert "m\\_1" in latex and "50\\%" in latex and "a \\& b" in latex and "$<$0.001" in latex
    body = latex.splitlines()
    assert body.count("\\midrule") == 2                  # header rule + one between models
    assert body.index("\\midrule", body.index("\\midrule") + 1) == body.index(
        "m\\_2 & $<$0.001 \\\\") - 1


def test_cli_writes_the_paper_table_and_re_renders_from_table_csv(sweep_dir, tmp_path):
    out = tmp_path / "out"
    assert main([str(sweep_dir), "--out", str(out), "--metric", PPL, "--pivot",
                 "allocation,sparsity", "--n-resamples", "99"]) == 0
    assert PPL_50 in (out / "paper_table.md").read_text()
    assert (out / "paper_table.tex").read_text().count("\\bfseries") == 2
    csv_before = (out / "table.csv").read_bytes()
    again = tmp_path / "again"
    again.mkdir()
    (again / "table.csv").write_bytes(csv_before)
    for name in ("table.md", "paper_table.md"):
        (out / name).unlink()
    assert main(["--from-table", str(again / "table.csv"), "--out", str(again), "--pivot",
                 "allocation,sparsity"]) == 0
    assert (again / "table.csv").read_bytes() == csv_before     # left as it is
    assert (again / "paper_table.md").exists() and (again / "table.md").exists()
    assert (again / "ppl-testbed-token_vs_sparsity.png").exists()
    assert not (again / "layer_scores.png").exists()            # no records, no profiles


def test_cli_from_a_missing_table_is_one_line(tmp_path, capsys):
    assert main(["--from-table", str(tmp_path / "nope.csv"), "--out", str(tmp_path)]) == 2
    assert "no such table" in capsys.readouterr().err


def test_a_label_only_some_rows_have_still_finds_the_others(sweep_dir):
    """Width methods have no depth scorer: their rows carry NaN there. pandas 3 keeps NaN missing
    through astype(str), so those rows were matched by no setting and every cell read '–'."""
    summary = _summary(sweep_dir)
    pals = summary["labels.allocation"] == "pals"  # two scorers, so the label varies; uniform: none
    summary["labels.scorer"] = pd.Series(None, index=summary.index, dtype="str")
    summary.loc[pals, "labels.scorer"] = summary.loc[pals, "labels.sparsity"].map({0.5: "sleb", 0.7: "angular"})
    table = paper.paper_table(summary, ["allocation", "scorer"], "sparsity")
    assert list(table.cells.columns[:2]) == ["Allocation", "Scorer"]
    cells = table.cells.drop(columns="Scorer").drop_duplicates("Allocation").set_index("Allocation")
    uniform = _mean(summary, "uniform", 0.5, PPL)
    assert cells.loc["uniform", PPL_50] == f"{uniform['mean']:.2f} ± {uniform['std']:.2f}"


def test_a_label_only_some_settings_have_is_a_row_of_its_own():
    """Wanda + DSnoT beside Wanda: refine is "dsnot" on one setting and missing on the other. That
    label varies; dropping it (pandas 3's nunique skips NaN) made the table ambiguous."""
    summary = pd.DataFrame({
        "setting": ["dense", "w", "wd", "s"], "metric": [PPL] * 4, "mean": [35.1, 63.5, 62.8, 50.5],
        "std": [0.0, 0.4, 0.2, 0.2], "n": [1, 3, 3, 3], "is_dense": [True, False, False, False],
        "higher_is_better": [False] * 4, "labels.method": ["dense", "wanda", "wanda", "sparsegpt"],
        "labels.refine": pd.Series([None, None, "dsnot", None], dtype="str"),
        "labels.sparsity": [None, 0.5, 0.5, 0.5]})
    assert records.label_varies(summary["labels.refine"][1:])
    assert not records.label_varies(summary["labels.sparsity"][1:])
    table = paper.paper_table(summary, ["method", "refine"], "sparsity")
    rows = [tuple(row) for row in table.cells.iloc[:, :3].itertuples(index=False)]
    assert ("wanda", "dsnot", "62.80 ± 0.20") in rows and ("wanda", "", "63.50 ± 0.40") in rows


def test_settings_read_as_words_in_headers():
    assert paper.setting_text("labels.sparsity", 0.5) == "50%"
    assert paper.setting_text("labels.params_removed", 0.2) == "20% params"
    assert paper.setting_text("labels.layers_removed", 4) == "4 layers"
    assert paper.setting_text("labels.sparsity_type", "2:4") == "2:4"


def test_the_main_table_shows_a_partial_label_only_where_it_tells_settings_apart():
    summary = pd.DataFrame({
        "is_dense": [True, False, False, False], "labels.model": ["m"] * 4,
        "labels.method": ["dense", "wanda", "wanda", "flap"],
        "labels.refine": pd.Series([None, None, "dsnot", None], dtype="str"),  # Wanda + DSnoT
        "labels.structure": pd.Series([None, None, None, "WIFV"], dtype="str"),  # FLAP's own
        "labels.sparsity": [None, 0.5, 0.5, 0.5]})
    assert render.display_label_columns(summary) == ["labels.model", "labels.method", "labels.refine"]


def test_a_row_label_no_record_has_is_left_out_with_a_warning_a_column_one_refused(sweep_dir, caplog):
    """A study's layout may name the label of a part not run yet (RIA's permutation)."""
    summary = _summary(sweep_dir)
    with caplog.at_level("WARNING"):
        table = paper.paper_table(summary, ["allocation", "permutation"], "sparsity")
    assert list(table.cells.columns[:1]) == ["Allocation"] and "'permutation' is in no record" in caplog.text
    assert tables.pivot(summary, ["allocation", "permutation"], "sparsity", PPL).shape[0] == 3
    with pytest.raises(records.AnalysisError, match="unknown label 'permutation'"):
        paper.paper_table(summary, ["allocation"], "permutation")
