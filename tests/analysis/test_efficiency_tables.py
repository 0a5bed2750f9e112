"""Speed-ups and costs in the tables: named for people, a median over seeds beside the mean,
no dense row invented for ratios to dense, paired by seed (never by sample) against a
baseline, and table.csv keeping the median."""

import math

import numpy as np
import pytest
from conftest import (ACC, COST_METRICS, MODEL, PPL, SEEDS, SPEEDUP_DECODE, SPEEDUP_PREFILL,
                      dense_metrics, labels_for, make_study, markdown_header, ratio_metric,
                      setting_metrics, signature_for, write_record)

from prunelab.analysis import compare, names, paper, records, tables

RATIOS = (SPEEDUP_PREFILL, SPEEDUP_DECODE, *COST_METRICS)


def _frame(root):
    return records.records_to_frame(records.load_records([root]))


def _row(summary, metric, allocation="uniform", sparsity=0.5):
    rows = summary[(summary["metric"] == metric) & ~summary["is_dense"]
                   & (summary["labels.allocation"] == allocation)
                   & (summary["labels.sparsity"] == sparsity)]
    assert len(rows) == 1
    return rows.iloc[0]


def _skewed_speedups(root, values):
    """One setting whose seeds measured `values` as prefill speed-up (one slow outlier)."""
    for seed, value in zip(SEEDS, values):
        pruned = {**setting_metrics(1.0, seed, 0.6),
                  SPEEDUP_PREFILL: ratio_metric(value, higher_is_better=True)}
        write_record(root, signature_for("skewed"), seed, labels_for("uniform", 0.5), pruned,
                     dense_metrics())


def test_every_ratio_metric_has_a_long_and_a_short_name():
    for key in RATIOS:
        long, short = names.display_name(key), names.short_name(key)
        assert key not in (long, short) and long != short
        assert names.is_relative_to_dense(key)
    assert names.display_name(SPEEDUP_PREFILL) == "Prefill speedup over dense (x)"
    assert names.short_name(SPEEDUP_DECODE) == "Decode speedup"
    assert names.display_name("cost/flops_prefill") == "Prefill FLOPs (fraction of dense)"
    assert [names.is_speedup(k) for k in (SPEEDUP_PREFILL, "cost/params", PPL)] == [
        True, False, False]
    assert [names.is_quality(k) for k in (PPL, "zeroshot/average", ACC, SPEEDUP_PREFILL)] == [
        True, True, False, False]


def test_median_over_seeds_beside_the_mean(tmp_path):
    values = [1.0, 1.2, 2.0]
    _skewed_speedups(tmp_path, values)
    frame = _frame(tmp_path)
    summary = tables.build_summary(frame)
    speed = _row(summary, SPEEDUP_PREFILL)
    assert speed["median"] == pytest.approx(np.median(values))
    assert speed["mean"] == pytest.approx(np.mean(values))
    assert speed["median"] != pytest.approx(speed["mean"])     # the outlier moves only the mean
    ppl_values = frame.loc[frame["metric"] == PPL, "value"]
    assert _row(summary, PPL)["median"] == pytest.approx(np.median(ppl_values))
    dense = summary[summary["is_dense"]].iloc[0]
    assert dense["median"] == dense["mean"]                   # one dense value: its own median
    columns = list(summary.columns)
    assert columns.index("mean") + 1 == columns.index("median") == columns.index("std") - 1


def test_ratio_metrics_get_no_dense_row_and_no_change_over_dense(efficiency_dir):
    summary = tables.build_summary(_frame(efficiency_dir))
    dense = summary[summary["is_dense"]]
    assert set(dense["metric"]) == {PPL, ACC, "zeroshot/average"}
    for metric in RATIOS:
        rows = summary[summary["metric"] == metric]
        assert len(rows) == 4 and not rows["is_dense"].any()
        assert rows["dense_mean"].isna().all() and rows["vs_dense"].isna().all()
        assert (rows["note"] == "").all()
    ppl_settings = summary[(summary["metric"] == PPL) & ~summary["is_dense"]]
    assert ppl_settings["vs_dense"].gt(0).all()               # quality still has its dense row


def test_speedup_table_shows_the_median_and_other_tables_keep_their_look(efficiency_dir,
                                                                            tmp_path):
    summary = tables.build_summary(_frame(efficiency_dir), [PPL, SPEEDUP_PREFILL])
    table, _ = tables.format_table(summary, vs_dense=True)
    assert f"{SPEEDUP_PREFILL} median" in table.columns
    assert f"{PPL} median" not in table.columns
    uniform = table[(table["allocation"] == "uniform") & (table["sparsity"] == "0.5")].iloc[0]
    median = _row(summary, SPEEDUP_PREFILL)["median"]
    assert uniform[f"{SPEEDUP_PREFILL} median"] == f"{median:.2f}"
    assert table.loc[table["method"] == "dense", f"{SPEEDUP_PREFILL} median"].eq("").all()
    assert table.loc[table["method"] == "dense", SPEEDUP_PREFILL].eq("").all()
    assert "median" in tables.to_latex(table)
    make_study(tmp_path / "plain")                            # no speed-ups: no median shown
    plain, _ = tables.format_table(tables.build_summary(_frame(tmp_path / "plain")))
    assert not any("median" in column for column in plain.columns)


def test_median_survives_table_csv(efficiency_dir, tmp_path):
    summary = tables.build_summary(_frame(efficiency_dir))
    written = tables.write_outputs(summary, tmp_path / "out")
    back = tables.read_summary_csv(written["csv"])
    np.testing.assert_allclose(back["median"], summary["median"])
    assert markdown_header(written["md"].read_text()).count(f"{SPEEDUP_PREFILL} median") == 1
    assert not back.loc[back["metric"].isin(RATIOS), "is_dense"].any()


def test_pivot_and_paper_table_take_ratio_metrics(efficiency_dir):
    summary = tables.build_summary(_frame(efficiency_dir))
    medians = tables.pivot(summary, "allocation", "sparsity", SPEEDUP_PREFILL, values="median")
    assert list(medians.index) == ["pals", "uniform"]            # no dense row to show
    assert medians.loc["uniform", 0.5] == _row(summary, SPEEDUP_PREFILL)["median"]
    table = paper.paper_table(summary, ["allocation"], "sparsity", [PPL, SPEEDUP_PREFILL])
    dense = table.cells.iloc[0]
    speed_headers = [c for c in table.cells.columns if c.startswith("Prefill speedup")]
    assert len(speed_headers) == 2 and (dense[speed_headers] == paper.MISSING).all()


def test_baseline_pairs_ratio_metrics_by_seed(efficiency_dir):
    frame = _frame(efficiency_dir)
    summary = tables.build_summary(frame, [SPEEDUP_PREFILL, "cost/flops_prefill"],
                                   baseline="allocation=uniform", n_resamples=99)
    pals = _row(summary, SPEEDUP_PREFILL, allocation="pals", sparsity=0.7)
    values = frame[frame["metric"] == SPEEDUP_PREFILL].set_index(["signature", "seed"])["value"]
    expected = np.mean([values[(signature_for(f"{MODEL}pals0.7"), s)]
                        - values[(signature_for(f"{MODEL}uniform0.7"), s)] for s in SEEDS])
    assert pals["n_pairs"] == len(SEEDS)
    assert pals["diff_mean"] == pytest.approx(expected) and pals["diff_mean"] < 0
    costs = summary[(summary["metric"] == "cost/flops_prefill") & ~summary["is_baseline"]
                    & ~summary["is_dense"]]
    assert costs["diff_mean"].abs().max() == pytest.approx(0)   # costs equal across allocation
    assert costs["note"].str.contains("constant|zero").all()


def test_two_single_runs_do_not_pair_ratio_metrics_by_sample(efficiency_dir):
    loaded = records.load_records([efficiency_dir]).completed
    by_name = {(r.labels["allocation"], r.labels["sparsity"], r.seed): r for r in loaded}
    result = compare.compare_runs(by_name[("pals", 0.5, 0)], by_name[("uniform", 0.5, 0)],
                                  [SPEEDUP_PREFILL, PPL], n_resamples=99)
    speed = result[result["metric"] == SPEEDUP_PREFILL].iloc[0]
    assert "no per-item samples" in speed["note"] and math.isnan(speed["p"])
    assert result.loc[result["metric"] == PPL, "p"].notna().all()
