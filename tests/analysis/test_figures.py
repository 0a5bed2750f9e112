"""Figures answer at a glance: display names on the axes, perplexity on a log axis, a panel per
scorer, no reused colour, error bars described, and a -1e-16 CI half-width does not crash."""

import numpy as np
import pandas as pd
import pytest
from conftest import MODEL, PPL, signature_for, write_record
from matplotlib.colors import to_hex

from prunelab.analysis import names, plots, records, style, tables


def _summary(root):
    frame = records.records_to_frame(records.load_records([root]))
    return tables.build_summary(frame, None)


def _visible_axes(figure):
    return [axis for axis in figure.axes if axis.get_visible()]


def test_display_names_come_from_one_table_with_fallbacks():
    assert names.display_name("ppl/realtext/token") == "Perplexity (real text, token)"
    assert names.display_name("zeroshot/average") == "Zero-shot accuracy (avg)"
    assert names.display_name("labels.layers_removed") == "Layers removed"
    assert names.display_name("ppl/ptb/word") == "Perplexity (PTB, word)"     # built from parts
    assert names.display_name("zeroshot/boolq/acc") == "Zero-shot accuracy (boolq)"
    assert names.short_name("ppl/testbed/token") == "PPL (testbed)"
    assert names.display_name("something_else") == "something_else"
    assert (names.direction(True), names.direction("False"), names.direction(None)) == (
        "↑", "↓", "")


def test_perplexity_plot_uses_log_axis_display_names_and_says_what_the_bars_are(sweep_dir):
    figure = plots.plot_metric_vs(_summary(sweep_dir), PPL, x="sparsity", error="std")
    axis = figure.axes[0]
    assert axis.get_yscale() == "log"
    assert axis.get_ylabel().startswith("Perplexity (testbed text, token)")
    assert axis.get_xlabel() == "Sparsity"
    legend = figure.legends[0]
    assert legend.get_title().get_text() == "mean ± std over 3 seeds"
    assert {text.get_text() for text in legend.get_texts()} == {"pals", "uniform", "dense model"}
    assert "ppl/" not in figure.get_suptitle()


def test_accuracy_stays_linear_and_ci_is_named(sweep_dir):
    figure = plots.plot_metric_vs(_summary(sweep_dir), "zeroshot/boolq/acc", x="sparsity",
                                  error="ci")
    assert figure.axes[0].get_yscale() == "linear"
    assert figure.legends[0].get_title().get_text() == "mean, 95% CI of the mean (t) over 3 seeds"


def test_negative_ci_half_width_is_clipped_and_draws(sweep_dir):
    summary = _summary(sweep_dir)
    settings = ~summary["is_dense"]
    summary.loc[settings, "ci_low"] = summary.loc[settings, "mean"] + 1e-16  # seeds agree
    summary.loc[settings, "ci_high"] = summary.loc[settings, "mean"] - 1e-16
    figure = plots.plot_metric_vs(summary, PPL, x="sparsity", error="ci")
    figure.canvas.draw()  # matplotlib refuses negative yerr: must not raise
    bars = style.error_bars(summary[settings], "ci")
    assert (bars >= 0).all()


def test_error_bars_clip_and_fill():
    frame = pd.DataFrame({"mean": [2.0, 3.0], "std": [np.nan, 0.5],
                          "ci_low": [2.0 + 1e-16, 2.0], "ci_high": [2.5, 3.0 - 1e-16]})
    np.testing.assert_array_equal(style.error_bars(frame, "std"), [[0.0, 0.5], [0.0, 0.5]])
    np.testing.assert_array_equal(style.error_bars(frame, "ci"), [[0.0, 1.0], [0.5, 0.0]])
    assert style.error_bars(frame, "none") is None
    assert style.error_caption("std", [3, 5]) == "mean ± std over 3–5 seeds"


def test_palette_never_reuses_a_colour():
    for count in (3, 10, 15, 40):
        colours = style.palette(range(count)).values()
        assert len({to_hex(colour) for colour in colours}) == count


def test_text_x_gives_points_per_category(tmp_path):
    root = tmp_path / "records"
    for method, offset in (("magnitude", 0.6), ("wanda", 0.3)):
        for pattern in ("unstructured", "2:4"):
            for seed in (0, 1):
                labels = {"model": MODEL, "method": method, "sparsity": 0.5,
                          "sparsity_type": pattern}
                value = {PPL: {"value": 3.0 + offset + (pattern == "2:4") + 0.01 * seed,
                               "higher_is_better": False, "protocol": {"seqlen": 128}}}
                write_record(root, signature_for(method + pattern), seed, labels, value)
    figure = plots.plot_metric_vs(_summary(root), PPL, x="sparsity_type")
    axis = figure.axes[0]
    assert [t.get_text() for t in axis.get_xticklabels()] == ["2:4", "unstructured"]
    assert axis.get_xlabel() == "Sparsity pattern"


def _depth_records(root):
    """Two scorers on scales 5e5 apart; each scorer's scores the same for 2 and 4 layers."""
    for scorer, scale in (("magnitude", 5e5), ("influence", 0.1)):
        for layers in (2, 4):
            for seed in (0, 1):
                labels = {"model": MODEL, "method": "depth", "scorer": scorer,
                          "layers_removed": layers}
                scores = [scale * (1 + 0.1 * i + 0.01 * seed) for i in range(6)]
                write_record(root, signature_for(f"{scorer}{layers}"), seed, labels,
                             {PPL: {"value": 3.0, "higher_is_better": False}},
                             layer_scores=scores, n_layers=6)
    return records.load_records([root]).completed


def test_layer_scores_get_a_panel_per_scorer_and_identical_profiles_once(tmp_path):
    figure = plots.plot_layer_profile(_depth_records(tmp_path / "records"), kind="scores")
    axes = _visible_axes(figure)
    assert sorted(axis.get_title() for axis in axes) == ["influence", "magnitude"]
    for axis in axes:
        assert len(axis.get_lines()) == 1          # 2 and 4 layers share their scores
        low, high = axis.get_ylim()
        assert high < 1 or low > 1e4               # own y-axis: 0.1 is not flattened by 5e5
    colours = {to_hex(axis.get_lines()[0].get_color()) for axis in axes}
    assert len(colours) == 2
    assert "mean over 2 seeds, band ± std" in figure.get_suptitle()


def test_layer_sparsity_gets_a_panel_per_target(sweep_dir):
    loaded = records.load_records([sweep_dir]).completed
    figure = plots.plot_layer_profile(loaded, kind="sparsity")
    axes = _visible_axes(figure)
    assert [axis.get_title() for axis in axes] == ["sparsity 0.5", "sparsity 0.7"]
    assert {t.get_text() for t in figure.legends[0].get_texts()} == {"pals", "uniform"}


def test_no_profile_data_raises():
    with pytest.raises(records.AnalysisError, match="no per-layer"):
        plots.plot_layer_profile([], kind="scores")


def test_legend_leaves_out_labels_implied_by_others(tmp_path):
    root = tmp_path / "records"
    for scorer, selector in (("sleb", "iterative"), ("wrp", "cluster")):
        for layers in (2, 4):
            labels = {"model": MODEL, "method": "depth", "scorer": scorer, "selector": selector,
                      "layers_removed": layers}
            write_record(root, signature_for(f"{scorer}{layers}"), 0, labels,
                         {PPL: {"value": 3.0 + layers, "higher_is_better": False}})
    figure = plots.plot_metric_vs(_summary(root), PPL, x="layers_removed")
    assert {t.get_text() for t in figure.legends[0].get_texts()} == {"sleb", "wrp"}


def test_profiles_equal_to_five_digits_are_one_line(tmp_path):
    root = tmp_path / "records"
    for layers, noise in ((2, 0.0), (4, 2.5e-8)):    # a re-run elsewhere: float32 noise
        labels = {"model": MODEL, "method": "depth", "scorer": "bi", "layers_removed": layers}
        write_record(root, signature_for(f"bi{layers}"), 0, labels,
                     {PPL: {"value": 3.0, "higher_is_better": False}},
                     layer_scores=[0.9 * (1 + noise), 0.2, 0.1])
    figure = plots.plot_layer_profile(records.load_records([root]).completed, kind="scores")
    assert len(_visible_axes(figure)[0].get_lines()) == 1


def test_legend_names_the_scorer_not_a_recovery_some_arms_skip(tmp_path):
    """Width arms carry recovery "none", the depth arms a scorer each, and recovery follows from
    the scorer: the legend names the scorer ("depth sleb"), not "depth none"."""
    root = tmp_path / "records"
    arms = ({"method": "flap", "recovery": "none"},
            {"method": "depth", "scorer": "block_influence", "recovery": "ghosted"},
            {"method": "depth", "scorer": "sleb", "recovery": "none"})
    for arm in arms:
        for budget in (0.1, 0.2):
            labels = {"model": MODEL, "params_removed": budget, **arm}
            write_record(root, signature_for(f"{arm.get('scorer', arm['method'])}{budget}"), 0,
                         labels, {PPL: {"value": 3.0 + budget, "higher_is_better": False}})
    figure = plots.plot_metric_vs(_summary(root), PPL, x="params_removed")
    assert {t.get_text() for t in figure.legends[0].get_texts()} == {
        "flap", "depth block_influence", "depth sleb"}
