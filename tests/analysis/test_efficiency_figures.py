"""The quality-versus-speed figure: a point per setting with the seeds' spread on both axes, the
dense model as a star at speed-up 1, perplexity on a log axis, a panel per model; written by
`write_plots` and `prunelab-aggregate` only for studies that measured speed-ups."""

import numpy as np
import pytest
from conftest import (AVERAGE, MODEL, PPL, SPEEDUP_DECODE, SPEEDUP_PREFILL,
                      make_efficiency_study, make_study)
from matplotlib.container import ErrorbarContainer

from prunelab.analysis import outputs, plots, records, style, tables
from prunelab.analysis.cli import main

SETTINGS = 4   # uniform and pals at sparsities 0.5 and 0.7


def _summary(*roots):
    frame = records.records_to_frame(records.load_records(list(roots)))
    return tables.build_summary(frame)


def _errorbars(axis):
    return [c for c in axis.containers if isinstance(c, ErrorbarContainer)]


def _stars(axis):
    return [line for line in axis.get_lines() if line.get_marker() == "*"]


def _setting(summary, metric, allocation, sparsity):
    rows = summary[(summary["metric"] == metric) & ~summary["is_dense"]
                   & (summary["labels.allocation"] == allocation)
                   & (summary["labels.sparsity"] == sparsity)]
    return rows.iloc[0]


def test_a_point_per_setting_with_bars_on_both_axes(efficiency_dir):
    summary = _summary(efficiency_dir)
    figure = plots.plot_quality_vs_speed(summary, PPL, error="std")
    (axis,) = figure.axes
    series = _errorbars(axis)
    assert len(series) == 2                                    # uniform, pals
    assert sum(len(c.lines[0].get_xdata()) for c in series) == SETTINGS
    assert all(c.has_xerr and c.has_yerr for c in series)
    x_bars, y_bars = next(c for c in series if c.get_label() == "uniform").lines[2]
    speed = _setting(summary, SPEEDUP_PREFILL, "uniform", 0.5)
    quality = _setting(summary, PPL, "uniform", 0.5)
    x_low, x_high = sorted(x_bars.get_segments(), key=lambda s: s[0][0])[0][:, 0]
    assert (x_low, x_high) == pytest.approx((speed["mean"] - speed["std"],
                                             speed["mean"] + speed["std"]))
    y_segment = sorted(y_bars.get_segments(), key=lambda s: s[0][0])[0]
    assert y_segment[:, 1] == pytest.approx((quality["mean"] - quality["std"],
                                             quality["mean"] + quality["std"]))
    labels = sorted(text.get_text() for text in axis.texts)
    assert labels == sorted(["0.5", "0.7"] * 2)                # each point named by its sparsity


def test_dense_star_axes_and_legend(efficiency_dir):
    summary = _summary(efficiency_dir)
    figure = plots.plot_quality_vs_speed(summary, PPL, error="ci")
    (axis,) = figure.axes
    (star,) = _stars(axis)
    dense = summary[(summary["metric"] == PPL) & summary["is_dense"]]["mean"].iloc[0]
    assert (star.get_xdata()[0], star.get_ydata()[0]) == pytest.approx((1.0, dense))
    assert axis.get_yscale() == "log" and axis.get_xscale() == "linear"
    assert axis.get_xlabel() == "Prefill speedup over dense (x) ↑"
    assert axis.get_ylabel() == "Perplexity (testbed text, token) ↓"
    legend = figure.legends[0]
    assert {t.get_text() for t in legend.get_texts()} == {"pals", "uniform", plots.DENSE_STAR}
    assert legend.get_title().get_text().startswith(style.error_caption("ci", [3]))
    low, high = axis.get_ylim()
    assert low < dense < high


def test_accuracy_stays_linear_and_decode_is_named(efficiency_dir):
    figure = plots.plot_quality_vs_speed(_summary(efficiency_dir), AVERAGE, SPEEDUP_DECODE,
                                         error="none")
    (axis,) = figure.axes
    assert axis.get_yscale() == "linear"
    assert axis.get_xlabel().startswith("Decode speedup over dense (x)")
    assert not any(c.has_xerr or c.has_yerr for c in _errorbars(axis))


def test_a_panel_per_model_each_with_its_dense_star(tmp_path):
    make_efficiency_study(tmp_path / "a", model="model-a")
    make_efficiency_study(tmp_path / "b", model="model-b", sparsities=(0.5,))
    figure = plots.plot_quality_vs_speed(_summary(tmp_path / "a", tmp_path / "b"), PPL)
    axes = figure.axes
    assert [axis.get_title() for axis in axes] == ["model-a", "model-b"]
    assert [sum(len(c.lines[0].get_xdata()) for c in _errorbars(axis)) for axis in axes] == [
        SETTINGS, SETTINGS // 2]
    assert [len(_stars(axis)) for axis in axes] == [1, 1]


def test_a_summary_without_the_speed_metric_is_a_one_line_error(tmp_path):
    make_study(tmp_path / "records")
    summary = _summary(tmp_path / "records")
    with pytest.raises(records.AnalysisError) as raised:
        plots.plot_quality_vs_speed(summary, PPL)
    assert SPEEDUP_PREFILL in str(raised.value) and "\n" not in str(raised.value)
    with pytest.raises(records.AnalysisError, match="unknown error bars"):
        plots.plot_quality_vs_speed(summary, PPL, error="iqr")


def test_metric_plot_of_a_speedup_draws_dense_at_one(efficiency_dir):
    figure = plots.plot_metric_vs(_summary(efficiency_dir), SPEEDUP_PREFILL, x="sparsity")
    texts = {t.get_text() for t in figure.legends[0].get_texts()}
    assert plots.DENSE_BY_DEFINITION in texts
    dense_lines = [line for line in figure.axes[0].get_lines()
                   if line.get_label() == plots.DENSE_BY_DEFINITION]
    assert np.allclose(dense_lines[0].get_ydata(), 1.0)


def _tradeoff_files(folder):
    return sorted(path.name for path in folder.glob("*_vs_speedup-*.png"))


def test_write_plots_adds_tradeoffs_only_with_speedups(efficiency_dir, tmp_path):
    summary = _summary(efficiency_dir)
    metrics = tables.available_metrics(summary)
    written = outputs.write_plots(summary, None, metrics, "labels.sparsity", "std",
                                  tmp_path / "with")
    quality = [plots.slug(m) for m in (PPL, AVERAGE)]
    speeds = [plots.slug(m) for m in (SPEEDUP_PREFILL, SPEEDUP_DECODE)]
    expected = sorted(f"{q}_vs_{s}.png" for q in quality for s in speeds)
    assert _tradeoff_files(tmp_path / "with") == expected
    assert all(path.stat().st_size > 0 for path in written)
    prefill_only = summary[summary["metric"] != SPEEDUP_DECODE]
    outputs.write_plots(prefill_only, None, metrics, None, "std", tmp_path / "prefill")
    assert _tradeoff_files(tmp_path / "prefill") == sorted(
        f"{q}_vs_{speeds[0]}.png" for q in quality)
    make_study(tmp_path / "plain")
    plain = _summary(tmp_path / "plain")
    outputs.write_plots(plain, None, tables.available_metrics(plain), "labels.sparsity", "std",
                        tmp_path / "without")
    assert _tradeoff_files(tmp_path / "without") == []
    assert (tmp_path / "without" / f"{plots.slug(PPL)}_vs_sparsity.png").exists()


def test_aggregate_end_to_end_with_speedups(efficiency_dir, tmp_path, capsys):
    out = tmp_path / "results"
    code = main([str(efficiency_dir), "--out", str(out), "--baseline", "allocation=uniform",
                 "--pivot", "allocation,sparsity", "--n-resamples", "99"])
    assert code == 0, capsys.readouterr().err
    for name in (f"{plots.slug(PPL)}_vs_{plots.slug(SPEEDUP_PREFILL)}.png",
                 f"{plots.slug(AVERAGE)}_vs_{plots.slug(SPEEDUP_DECODE)}.png",
                 f"{plots.slug(SPEEDUP_PREFILL)}_vs_sparsity.png",
                 "cost-flops_prefill_vs_sparsity.png", "paper_table.md", "table.tex",
                 f"pivot_sparsity_{plots.slug(SPEEDUP_PREFILL)}.md"):
        assert (out / name).stat().st_size > 0, name
    summary = tables.read_summary_csv(out / "table.csv")
    speed = summary[summary["metric"] == SPEEDUP_PREFILL]
    assert len(speed) == SETTINGS and not speed["is_dense"].any()
    assert speed["median"].notna().all() and speed["n_pairs"].notna().any()
    again = tmp_path / "again"
    assert main(["--from-table", str(out / "table.csv"), "--out", str(again)]) == 0
    assert _tradeoff_files(again) == _tradeoff_files(out)
    assert MODEL in (out / "table.md").read_text()
