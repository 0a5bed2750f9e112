"""Summary tables: the numbers equal scipy's on the same values, refusals, pivots, outputs."""

import math
import re

import numpy as np
import pandas as pd
import pytest
from conftest import (ACC, PPL, SEEDS, labels_for, markdown_header, ppl_metric, signature_for,
                      write_record)
from scipy import stats as scipy_stats

from prunelab.analysis import compare, records, stats, tables


def _frame(root):
    return records.records_to_frame(records.load_records([root]))


def _values(frame, allocation, metric=PPL):
    rows = frame[(frame["labels.allocation"] == allocation) & (frame["metric"] == metric)]
    return rows.sort_values("seed")["value"].to_numpy()


def test_summary_p_values_equal_scipy_on_the_same_numbers(study_dir):
    frame = _frame(study_dir)
    summary = tables.build_summary(frame, [PPL, ACC], baseline="allocation=uniform",
                                   n_resamples=999)
    for metric in (PPL, ACC):
        pals, uniform = _values(frame, "pals", metric), _values(frame, "uniform", metric)
        row = summary[(summary["labels.allocation"] == "pals") & (summary["metric"] == metric)]
        row = row.iloc[0]
        assert row["n"] == 3 and row["n_pairs"] == 3
        assert row["mean"] == pytest.approx(pals.mean())
        assert row["std"] == pytest.approx(pals.std(ddof=1))
        assert row["diff_mean"] == pytest.approx((pals - uniform).mean())
        assert row["p_t"] == pytest.approx(scipy_stats.ttest_rel(pals, uniform).pvalue)
        if np.count_nonzero(pals - uniform):
            assert row["p_wilcoxon"] == pytest.approx(scipy_stats.wilcoxon(pals, uniform).pvalue)
    compared = summary.dropna(subset=["p_t"])
    np.testing.assert_allclose(compared["p_t_holm"], stats.holm(compared["p_t"].to_numpy()))
    ppl_row = summary[(summary["labels.allocation"] == "pals") & (summary["metric"] == PPL)]
    assert ppl_row["diff_ci_low"].iloc[0] <= ppl_row["diff_mean"].iloc[0] <= ppl_row[
        "diff_ci_high"].iloc[0] < 0


def test_dense_reference_once_per_model_and_cells(study_dir):
    summary = tables.build_summary(_frame(study_dir), [PPL], baseline="allocation=uniform",
                                   n_resamples=999)
    dense = summary[summary["is_dense"]]
    assert len(dense) == 1 and dense["labels.method"].iloc[0] == "dense"
    table, notes = tables.format_table(summary)
    assert list(table["method"]) == ["dense", "wanda", "wanda"]
    pals = table[table["allocation"] == "pals"].iloc[0]
    assert pals[PPL].endswith("(3)") and " ± " in pals[PPL]
    assert table[table["allocation"] == "uniform"].iloc[0]["Δ [95% CI]"] == "baseline"
    assert any("Wilcoxon with n=3" in note for note in notes)


def _two_settings(root, base_labels: dict, other_labels: dict, other_seqlen: int = 128) -> None:
    """Records of two settings over SEEDS, the second 0.1 lower in every window's NLL."""
    for seed in SEEDS:
        window = np.full(8, 2.0) + 0.01 * seed
        write_record(root, signature_for(str(base_labels)), seed, base_labels, {PPL: ppl_metric(window)})
        write_record(root, signature_for(str(other_labels)), seed, other_labels,
                     {PPL: ppl_metric(window - 0.1, seqlen=other_seqlen)})


def test_setting_with_a_different_protocol_is_refused(tmp_path):
    root = tmp_path / "records"
    _two_settings(root, labels_for("uniform", 0.5), labels_for("pals", 0.5), other_seqlen=256)
    summary = tables.build_summary(_frame(root), [PPL], baseline="allocation=uniform")
    row = summary[summary["labels.allocation"] == "pals"].iloc[0]
    assert math.isnan(row["p_t"]) and "seqlen 256 vs 128" in row["note"]


def test_a_baseline_selects_the_setting_without_a_label_by_none(tmp_path):
    """Wanda and Wanda refined by DSnoT share method=wanda; refine=none names Wanda itself."""
    root = tmp_path / "records"
    _two_settings(root, labels_for("uniform", 0.5), {**labels_for("uniform", 0.5), "refine": "dsnot"})
    ambiguous = tables.build_summary(_frame(root), [PPL], baseline="method=wanda")
    assert ambiguous["p_t"].isna().all()  # two baselines match: refused, not guessed
    summary = tables.build_summary(_frame(root), [PPL], baseline="method=wanda,refine=none", n_resamples=99)
    row = summary[summary["labels.refine"] == "dsnot"].iloc[0]
    assert row["diff_mean"] < 0 and row["n_pairs"] == len(SEEDS)
    assert summary.loc[summary["labels.refine"].isna() & ~summary["is_dense"], "is_baseline"].all()
    grid = tables.pivot(summary, ["method", "refine"], "sparsity", PPL, values="mean")
    assert len(grid) == 2 and grid.iloc[:, 0].notna().all()  # wanda, wanda + dsnot: both rows


def test_unknown_baseline_and_metric_errors_list_what_exists(study_dir):
    frame = _frame(study_dir)
    with pytest.raises(records.AnalysisError, match="values seen: allocation: pals, uniform"):
        tables.build_summary(frame, [PPL], baseline="allocation=owl")
    with pytest.raises(records.AnalysisError, match=re.escape(f"available: {PPL}, {ACC}")):
        tables.select_metrics(frame, ["ppl/wikitext2/token"])
    assert tables.select_metrics(frame, ["ppl/*"]) == [PPL]


def test_an_optional_metric_is_left_out_where_the_records_lack_it(study_dir):
    frame = _frame(study_dir)
    assert tables.select_metrics(frame, ["ppl/*"], optional=["speedup/*", ACC]) == [PPL, ACC]
    assert tables.select_metrics(frame, ["ppl/*"], optional=["speedup/*"]) == [PPL]
    with pytest.raises(records.AnalysisError, match="unknown metric 'speedup/prefill'"):
        tables.select_metrics(frame, ["speedup/prefill"], optional=[ACC])   # a required one stays required
    with pytest.raises(records.AnalysisError, match="none of the optional metrics speedup/"):
        tables.select_metrics(frame, [], optional=["speedup/*"])


def test_signature_baseline_and_group_by_labels(sweep_dir):
    frame = _frame(sweep_dir)
    base = signature_for("uniform0.5")
    summary = tables.build_summary(frame, [PPL], baseline=base, n_resamples=99)
    compared = summary[~summary["is_dense"] & ~summary["is_baseline"]]
    assert len(compared) == 3 and compared["p_t"].notna().all()
    grouped = tables.build_summary(frame, [PPL], group_by=["allocation"])
    assert sorted(grouped.loc[~grouped["is_dense"], "n"]) == [6, 6]


def test_pivot_method_by_sparsity(sweep_dir):
    summary = tables.build_summary(_frame(sweep_dir), [PPL])
    grid = tables.pivot(summary, "allocation", "sparsity", PPL)
    assert list(grid.index) == ["dense", "pals", "uniform"]
    assert list(grid.columns) == [0.5, 0.7]
    assert grid.loc["dense", 0.5] == grid.loc["dense", 0.7]
    numbers = tables.pivot(summary, ["allocation"], "sparsity", PPL, values="mean")
    assert numbers.loc["pals", 0.7] < numbers.loc["uniform", 0.7]
    with pytest.raises(records.AnalysisError, match="ambiguous"):
        tables.pivot(summary, "method", "sparsity", PPL)


def test_markdown_latex_and_csv_round_trip(study_dir, tmp_path):
    summary = tables.build_summary(_frame(study_dir), [PPL], baseline="allocation=uniform",
                                   n_resamples=99)
    written = tables.write_outputs(summary, tmp_path / "out")
    markdown = written["md"].read_text()
    assert markdown_header(markdown)[:2] == ["model", "method"] and "Notes:" in markdown
    assert markdown.splitlines()[1].startswith("|:")  # tabulate's pipe alignment row
    latex = written["tex"].read_text()
    assert "\\toprule" in latex and "\\bottomrule" in latex and "$\\pm$" in latex
    back = tables.read_summary_csv(written["csv"])
    assert back["is_dense"].dtype == bool
    pd.testing.assert_series_equal(back["p_t"], summary["p_t"], check_dtype=False)


def test_compare_runs_per_item(study_dir):
    loaded = records.load_records([study_dir])
    by_allocation = {r.labels["allocation"]: r for r in loaded.completed if r.seed == 0}
    result = compare.compare_runs(by_allocation["pals"], by_allocation["uniform"],
                                 n_resamples=999).set_index("metric")
    assert result.loc[PPL, "difference"] < 0 and result.loc[PPL, "ci_high"] < 0
    assert result.loc[ACC, "test"].startswith("McNemar")
    same = compare.compare_runs(by_allocation["pals"], by_allocation["pals"], n_resamples=99)
    assert (same["p"] == 1.0).all() and (same["difference"] == 0).all()


def test_partial_seed_overlap_is_paired_on_shared_seeds_with_a_note(tmp_path):
    root = tmp_path / "records"
    for seed in (0, 1, 2, 3):
        write_record(root, signature_for("u"), seed, labels_for("uniform", 0.5),
                     {PPL: ppl_metric(np.full(8, 2.0) + 0.03 * seed)})
    for seed in (1, 2, 3, 4):
        write_record(root, signature_for("p"), seed, labels_for("pals", 0.5),
                     {PPL: ppl_metric(np.full(8, 1.9) + 0.01 * seed ** 2)})
    summary = tables.build_summary(_frame(root), [PPL], baseline="allocation=uniform",
                                   n_resamples=99)
    row = summary[summary["labels.allocation"] == "pals"].iloc[0]
    assert row["n_pairs"] == 3 and "paired on the 3 shared seeds (4 vs 4 runs)" in row["note"]


def test_settings_with_identical_labels_show_their_signature(tmp_path):
    root = tmp_path / "records"
    for name in ("a", "b"):
        write_record(root, signature_for(name), 0, labels_for("uniform", 0.5),
                     {PPL: ppl_metric(np.full(8, 2.0))})
    table, _ = tables.format_table(tables.build_summary(_frame(root), [PPL]))
    assert "setting" in table.columns
    assert set(table["setting"]) == {signature_for("a"), signature_for("b")}


def test_grouping_that_mixes_protocols_says_so(tmp_path):
    root = tmp_path / "records"
    write_record(root, signature_for("s128"), 0, labels_for("uniform", 0.5),
                 {PPL: ppl_metric(np.full(8, 2.0))})
    write_record(root, signature_for("s256"), 1, labels_for("uniform", 0.5),
                 {PPL: ppl_metric(np.full(8, 2.0), seqlen=256)})
    summary = tables.build_summary(_frame(root), [PPL], group_by=["method"])
    assert re.search(r"mixes protocols \(.*seqlen (128 vs 256|256 vs 128)", summary["note"].iloc[0])


def test_change_over_dense_is_the_mean_relative_to_the_dense_value(sweep_dir):
    frame = _frame(sweep_dir)
    summary = tables.build_summary(frame, [PPL])
    dense = frame[frame["metric"] == PPL]["dense_value"].dropna().iloc[0]
    row = summary[(summary["labels.allocation"] == "pals") & (summary["labels.sparsity"] == 0.7)]
    row = row.iloc[0]
    assert row["vs_dense"] == pytest.approx(row["mean"] / dense - 1)
    assert row["vs_dense_std"] == pytest.approx(row["std"] / dense)
    table, _ = tables.format_table(summary, vs_dense=True)
    shown = table[(table["allocation"] == "pals") & (table["sparsity"] == "0.7")]["vs dense"].iloc[0]
    assert shown == f"{100 * row['vs_dense']:+.1f} ± {100 * row['vs_dense_std']:.1f}%"
    assert table[table["method"] == "dense"]["vs dense"].iloc[0] == ""
    grid = tables.pivot(summary, "allocation", "sparsity", PPL, vs_dense=True)
    assert grid.loc["pals", 0.7].endswith(f"({100 * row['vs_dense']:+.1f}%)")


def test_a_note_on_every_setting_is_said_once_not_listed_row_by_row():
    from prunelab.analysis.render import _where

    names = [f"wanda {s}" for s in range(10)]
    assert _where({PPL: names}, {PPL: 10}) == "every setting"
    both = _where({PPL: names, "zeroshot/average": names}, {PPL: 10, "zeroshot/average": 10})
    assert both == f"every setting [{PPL}, zeroshot/average]"
    partial = _where({PPL: names[:8]}, {PPL: 10})
    assert partial.startswith("wanda 0 [") and partial.endswith("and 2 more")
    assert _where({PPL: names, "zeroshot/average": names[:1]}, {PPL: 10, "zeroshot/average": 10}) == (
        f"every setting [{PPL}]; wanda 0 [zeroshot/average]")
