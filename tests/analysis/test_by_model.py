"""Side-by-side tables: each model's cell carries its own numbers, rows join across corpora."""

import json

import pandas as pd

from conftest import MODEL, make_study, markdown_header

from prunelab.analysis import by_model, records, tables

REAL = "real-model"


def _summary(root, out):
    frame = records.records_to_frame(records.load_records([root]))
    summary = tables.build_summary(frame, None, baseline="allocation=uniform", n_resamples=99)
    return summary, tables.write_outputs(summary, out, formats=("csv",))["csv"]


def _as_other_model(source, target, sparsities):
    """Copy of the study's records as another model evaluated on another corpus."""
    for path in source.rglob("result.json"):
        record = json.loads(path.read_text())
        if record["labels"]["sparsity"] not in sparsities:
            continue
        record["labels"]["model"] = REAL
        for part in record["metrics"].values():
            if "ppl/testbed/token" in part:
                part["ppl/realtext/token"] = part.pop("ppl/testbed/token")
        copy = target / path.relative_to(source)
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.write_text(json.dumps(record))


def test_models_side_by_side(tmp_path):
    testbed, real = tmp_path / "testbed", tmp_path / "real"
    make_study(testbed, sparsities=(0.5, 0.7))
    _as_other_model(testbed, real, sparsities=(0.5,))
    testbed_summary, testbed_csv = _summary(testbed, tmp_path / "out_testbed")
    real_summary, real_csv = _summary(real, tmp_path / "out_real")

    out = tmp_path / "by_model.md"
    assert by_model.main([str(testbed_csv), str(real_csv), "--out", str(out)]) == 0
    table = by_model.side_by_side([tables.read_summary_csv(testbed_csv),
                                   tables.read_summary_csv(real_csv)])

    assert list(table.columns[-2:]) == [MODEL, REAL]
    assert table.iloc[0]["sparsity"] == "dense"            # dense first
    ppl = table[table["metric"] == "ppl/token"]            # corpora joined into one family
    pals_05 = ppl[(ppl["allocation"] == "pals") & (ppl["sparsity"] == "0.5")].iloc[0]
    for summary, column, metric in ((testbed_summary, MODEL, "ppl/testbed/token"),
                                    (real_summary, REAL, "ppl/realtext/token")):
        row = summary[(summary["labels.allocation"] == "pals") & (summary["metric"] == metric)
                      & (summary["labels.sparsity"] == 0.5)].iloc[0]
        assert f"{row['mean']:.2f}" in pals_05[column]
        assert f"{100 * row['vs_dense']:+.1f}%" in pals_05[column]
        assert "p " in pals_05[column]
    uniform_07 = ppl[(ppl["allocation"] == "uniform") & (ppl["sparsity"] == "0.7")].iloc[0]
    assert "baseline" in uniform_07[MODEL] and uniform_07[REAL] == ""   # only the testbed ran it
    written = out.read_text()
    assert markdown_header(written) == ["sparsity", "allocation", "metric", MODEL, REAL]
    assert "method" not in table.columns          # the same in every setting: no column
    assert table.iloc[0]["sparsity"] == "dense"


def test_missing_table_is_one_line(tmp_path, capsys):
    assert by_model.main([str(tmp_path / "nope.csv"), "--out", str(tmp_path / "x.md")]) == 2
    assert capsys.readouterr().err.startswith("by_model: error: no such table")


def test_layer_counts_are_joined_by_rank_and_shown_per_model():
    """6 of 18 layers is not 6 of 30: depth rows are joined by rank within each model (lighter
    with lighter), and the layers column names each model's own count."""
    def summary(model, layers):
        return pd.DataFrame([{"setting": f"{model}{count}{scorer}", "labels.model": model,
                              "labels.method": "depth", "labels.layers_removed": float(count),
                              "labels.scorer": scorer, "labels.selector": f"by_{scorer}",
                              "metric": "ppl/x/token", "n": 3, "mean": 3.0, "std": 0.1,
                              "is_dense": False, "is_baseline": False, "vs_dense": 0.5}
                             for scorer in ("a", "b") for count in layers])
    table = by_model.side_by_side([summary("small", [4, 6]), summary("real", [6, 8])])
    assert list(table.columns) == ["layers_removed", "scorer", "metric", "small", "real"]
    assert list(table["layers_removed"]) == ["4 / 6", "4 / 6", "6 / 8", "6 / 8"]
    assert (table[["small", "real"]] != "").all(axis=None)     # every cell filled
    assert "selector" not in table.columns                     # implied by the scorer
    only_small = by_model.side_by_side([summary("small", [4, 6]), summary("real", [8])])
    assert list(only_small["layers_removed"]) == ["4 / 8", "4 / 8", "6 / –", "6 / –"]


def test_a_foreign_csv_is_one_line(tmp_path, capsys):
    foreign = tmp_path / "other.csv"
    foreign.write_text("a,b\n1,2\n")
    assert by_model.main([str(foreign), "--out", str(tmp_path / "x.md")]) == 2
    assert "is not a table.csv written by prunelab-aggregate" in capsys.readouterr().err


def test_depth_arms_are_named_by_their_scorer_not_by_a_recovery_the_width_arms_skip():
    settings = pd.DataFrame({
        "labels.model": ["m"] * 4, "labels.method": ["depth", "depth", "flap", "wanda_sp"],
        "labels.recovery": ["ghosted", "none", "none", "none"],  # before scorer, as in the records
        "labels.scorer": ["block_influence", "sleb", None, None], "is_dense": [False] * 4})
    assert by_model._key_columns(settings) == ["labels.method", "labels.scorer"]


def test_the_backbone_figure_has_a_panel_per_model_with_each_models_own_perplexity(tmp_path):
    testbed, real = tmp_path / "testbed", tmp_path / "real"
    make_study(testbed, sparsities=(0.5, 0.7))
    _as_other_model(testbed, real, sparsities=(0.5, 0.7))
    summaries = [tables.read_summary_csv(_summary(root, tmp_path / f"out_{root.name}")[1])
                 for root in (testbed, real)]
    figure = by_model.backbone_figure(summaries)
    axes = figure.axes
    assert [axis.get_title() for axis in axes] == [MODEL, REAL]
    for axis, summary in zip(axes, summaries):  # each panel plots its own model's means
        uniform = summary[(summary["labels.allocation"] == "uniform") & ~summary["is_dense"].astype(bool)
                          & summary["metric"].str.startswith("ppl/")].sort_values("labels.sparsity")
        assert any(list(line.get_ydata()) == list(uniform["mean"]) for line in axis.get_lines())
    out = tmp_path / "by_model.md"
    csvs = [str(tmp_path / f"out_{name}" / "table.csv") for name in ("testbed", "real")]
    assert by_model.main([*csvs, "--out", str(out), "--figure", str(tmp_path / "by_model.png")]) == 0
    assert (tmp_path / "by_model.png").stat().st_size > 10_000
