"""Study plots: a metric against a label (sparsity, layers removed, sparsity pattern) per method,
quality against speed-up over dense (the trade-off a pruned model is chosen by), per-layer
profiles (in `profiles`, re-exported here) and all-pairs layer matrices.

Inputs are the tidy summary from `tables.build_summary` (or a table.csv read back with
`tables.read_summary_csv`) and the loaded records. Every figure names its axes from
`names.DISPLAY_NAMES`, puts perplexity on a log axis, gives each model its own panel (models are
evaluated on their own text, so their scales differ) and says what its error bars are; see
`style` for the shared look.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from prunelab.analysis.names import direction, display_name, is_perplexity, is_relative_to_dense
from prunelab.analysis.profiles import layer_profiles, plot_layer_profile  # noqa: F401
from prunelab.analysis.records import LABEL_PREFIX, AnalysisError, label_columns, label_varies
from prunelab.analysis.render import distinguishing_labels, none_last, text_of
from prunelab.analysis.style import (  # noqa: F401  (save_figure, slug, figure_png for callers)
    ERROR_BARS,
    error_bars,
    error_caption,
    figure_png,
    markers,
    new_figure,
    palette,
    save_figure,
    slug,
    use_log_axis,
)

MODEL = LABEL_PREFIX + "model"
LEGEND_WIDTH = 2.8  # inches beside the panels for the figure's legend
DENSE_BY_DEFINITION = "dense model (1 by definition)"
DENSE_STAR = "dense model (speed-up 1 by definition)"
#: Labels that order a method's settings from light to heavy pruning: the quality-vs-speed
#: figure joins a series' points in this order and writes the value beside each point.
LADDER_LABELS = ("labels.sparsity", "labels.layers_removed", "labels.params_removed")


def main_metric(summary: pd.DataFrame) -> str:
    """The metric a study's main figure shows: its first perplexity, else its first metric."""
    metrics = list(dict.fromkeys(summary["metric"]))
    if not metrics:
        raise AnalysisError("the summary has no metrics")
    return next((m for m in metrics if is_perplexity(m)), metrics[0])


def plot_metric_vs(summary: pd.DataFrame, metric: str, x: str = "labels.sparsity",
                   hue: Sequence[str] | None = None, error: str = "std") -> Figure:
    """`metric` (mean over seeds) against the label `x`, one series per method (the labels that
    vary, or `hue`), one panel per model, the dense model as a dashed line.

    A numeric `x` gives lines; a text `x` (sparsity pattern) gives points per category, dodged
    apart. Error bars: the seed std (error="std"), the 95% t-interval of the mean ("ci") or
    none; the legend title says which, and over how many seeds. Perplexity is on a log axis.
    """
    if error not in ERROR_BARS:
        raise AnalysisError(f"unknown error bars {error!r}; use {', '.join(ERROR_BARS)}")
    x = x if x in summary.columns else LABEL_PREFIX + x
    if x not in summary.columns:
        raise AnalysisError(f"unknown x {x!r}; labels: {', '.join(label_columns(summary))}")
    part = summary[summary["metric"] == metric]
    settings = part[~part["is_dense"].astype(bool) & part[x].notna()].copy()
    if settings.empty:
        raise AnalysisError(f"no {x} values for {metric}")
    numeric = pd.to_numeric(settings[x], errors="coerce")
    categories = None if numeric.notna().all() else list(dict.fromkeys(settings[x].astype(str)))
    settings["_x"] = numeric if categories is None else settings[x].astype(str).map(
        {name: i for i, name in enumerate(categories)})
    series, colours, shapes, models, figure, axes = _panels(settings, hue, exclude=(x,))
    dodge = 0.6 / max(len(series), 1)
    for axis, model in zip(axes, models):
        shown = []
        for i, (name, line) in enumerate(series):
            if model is not None:
                line = line[line[MODEL] == model]
            if line.empty:
                continue
            line = line.sort_values("_x")
            offset = 0 if categories is None else (i - (len(series) - 1) / 2) * dodge
            position = line["_x"] + offset
            bars = error_bars(line, error)
            axis.errorbar(position, line["mean"], yerr=bars, capsize=3,
                          marker=shapes[name], color=colours[name], label=name or None,
                          linestyle="-" if categories is None else "none", markersize=5)
            spread = np.zeros((2, len(line))) if bars is None else bars
            shown += list(line["mean"] - spread[0]) + list(line["mean"] + spread[1])
        dense = part[part["is_dense"].astype(bool)]
        if model is not None and MODEL in dense:
            dense = dense[dense[MODEL] == model]
        for value in dense["mean"].head(1):
            axis.axhline(value, color="grey", linestyle="--", linewidth=1, label="dense model")
            shown.append(value)
        if dense.empty and is_relative_to_dense(metric):  # a ratio to dense: no dense row
            axis.axhline(1.0, color="grey", linestyle="--", linewidth=1,
                         label=DENSE_BY_DEFINITION)
            shown.append(1.0)
        _x_axis(axis, settings if model is None else settings[settings[MODEL] == model], x,
                categories)
        if is_perplexity(metric):
            _log_limits(axis, shown)
        axis.set_ylabel(f"{display_name(metric)} {direction(part['higher_is_better'].iloc[0])}")
        axis.set_title(str(model) if model is not None else "")
        axis.grid(alpha=0.3, which="both" if is_perplexity(metric) else "major")
    _figure_legend(figure, axes, error_caption(error, settings["n"]))
    figure.suptitle(f"{display_name(metric)} vs {display_name(x).lower()}")
    return figure


def plot_quality_vs_speed(summary: pd.DataFrame, quality_metric: str,
                          speed_metric: str = "speedup/prefill", error: str = "std",
                          hue: Sequence[str] | None = None) -> Figure:
    """What a method's speed costs in quality: `quality_metric` against `speed_metric` (a
    speed-up over dense), means over seeds, one point per setting, one panel per model.

    Error bars on both axes follow `plot_metric_vs` (the seeds' std, the 95% t-interval of the
    mean, or none). The settings one series holds (the labels that vary, or `hue`) are joined
    from light to heavy pruning, each point labelled with its sparsity or layers removed. The
    dense model is a star at speed-up 1 (by definition) and its own quality, from the summary's
    dense row (none when the records carry no dense value). Perplexity is on a log axis.
    Raises AnalysisError when the summary lacks either metric.
    """
    if error not in ERROR_BARS:
        raise AnalysisError(f"unknown error bars {error!r}; use {', '.join(ERROR_BARS)}")
    quality = _setting_rows(summary, quality_metric)
    speed = _setting_rows(summary, speed_metric)
    settings = quality.loc[[name for name in quality.index if name in speed.index]]
    if settings.empty:
        raise AnalysisError(f"no setting has both {quality_metric} and {speed_metric}")
    ladder = _ladder(settings)
    series, colours, shapes, models, figure, axes = _panels(settings, hue, exclude=(ladder,))
    # A series rises to the right when lower quality numbers are better (perplexity grows with
    # speed), so its point labels go above left of the line, else above right.
    rising = direction(quality["higher_is_better"].iloc[0]) == "↓"
    offset, align = ((-4, 4), "right") if rising else ((4, 4), "left")
    for axis, model in zip(axes, models):
        shown = []
        for name, points in series:
            if model is not None:
                points = points[points[MODEL] == model]
            if points.empty:
                continue
            if ladder:
                points = points.sort_values(ladder, key=lambda v: pd.to_numeric(v, "coerce"))
            ys, xs = points, speed.loc[points.index]
            yerr = error_bars(ys, error)
            axis.errorbar(xs["mean"], ys["mean"], xerr=error_bars(xs, error), yerr=yerr,
                          capsize=3, marker=shapes[name], color=colours[name], markersize=5,
                          label=name or None, linestyle="-" if ladder else "none", linewidth=1)
            spread = np.zeros((2, len(ys))) if yerr is None else yerr
            shown += list(ys["mean"] - spread[0]) + list(ys["mean"] + spread[1])
            for x_value, y_value, step in zip(xs["mean"], ys["mean"],
                                              ys[ladder] if ladder else []):
                axis.annotate(text_of(step), (x_value, y_value), xytext=offset,
                              textcoords="offset points", fontsize="x-small",
                              horizontalalignment=align, color=colours[name])
        shown += _dense_star(axis, summary, quality_metric, model)
        axis.axvline(1.0, color="grey", linestyle=":", linewidth=1)  # no speed-up
        if is_perplexity(quality_metric):
            _log_limits(axis, shown)
        axis.set_xlabel(_axis_label(speed_metric, speed))
        axis.set_ylabel(_axis_label(quality_metric, quality))
        axis.set_title(str(model) if model is not None else "")
        axis.grid(alpha=0.3, which="both" if is_perplexity(quality_metric) else "major")
    caption = error_caption(error, pd.concat([settings["n"], speed.loc[settings.index, "n"]]))
    if ladder:
        caption += f"\npoints labelled by {display_name(ladder).lower()}"
    _figure_legend(figure, axes, caption)
    figure.suptitle(f"{display_name(quality_metric)} vs {display_name(speed_metric).lower()}")
    return figure


def plot_matrix(matrix: Sequence[Sequence[float | None]], title: str,
                label: str = "similarity") -> Figure:
    """Heatmap of an all-pairs layer matrix (WRP similarity, swap-KL distances); None = not
    probed (left blank)."""
    values = np.array([[np.nan if v is None else float(v) for v in row] for row in matrix])
    figure = new_figure(1)
    ax = figure.add_subplot()
    image = ax.imshow(values, cmap="viridis", origin="upper")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # layer indices, not 2.5
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("Layer j")
    ax.set_ylabel("Layer i")
    ax.set_title(title)
    figure.colorbar(image, ax=ax, label=label)
    return figure


# --------------------------------------------------------------------------- helpers


def _setting_rows(summary: pd.DataFrame, metric: str) -> pd.DataFrame:
    """The non-dense rows of `metric`, indexed by setting; AnalysisError when there are none."""
    part = summary[(summary["metric"] == metric) & ~summary["is_dense"].astype(bool)]
    if part.empty:
        available = ", ".join(dict.fromkeys(summary["metric"])) or "none"
        raise AnalysisError(f"the summary has no {metric} (metrics: {available})")
    return part.set_index("setting")


def _ladder(settings: pd.DataFrame) -> str | None:
    """The first of LADDER_LABELS whose numbers vary across `settings`, else None."""
    for column in LADDER_LABELS:
        if column in settings and pd.to_numeric(settings[column], errors="coerce").nunique() > 1:
            return column
    return None


def _axis_label(metric: str, rows: pd.DataFrame) -> str:
    """The metric's display name and its direction: "Prefill speedup over dense (x) ↑"."""
    return f"{display_name(metric)} {direction(rows['higher_is_better'].iloc[0])}"


def _dense_star(axis, summary: pd.DataFrame, metric: str, model) -> list[float]:
    """The dense model at speed-up 1 with its `metric` value; returns the value drawn (if any)."""
    dense = summary[(summary["metric"] == metric) & summary["is_dense"].astype(bool)]
    if model is not None and MODEL in dense:
        dense = dense[dense[MODEL] == model]
    values = list(dense["mean"].head(1))
    for value in values:
        axis.plot([1.0], [value], linestyle="none", marker="*", markersize=14, color="black",
                  zorder=5, clip_on=False, label=DENSE_STAR)
    return values


def _figure_legend(figure: Figure, axes, title: str) -> None:
    """One legend beside the panels: every series of every panel once."""
    handles, labels = axes[0].get_legend_handles_labels()
    for axis in axes[1:]:  # series missing from the first panel
        for handle, label in zip(*axis.get_legend_handles_labels()):
            if label not in labels:
                handles.append(handle)
                labels.append(label)
    figure.legend(handles, labels, loc="outside right center", fontsize="small",
                  title=title, title_fontsize="small")


def _panels(settings: pd.DataFrame, hue: Sequence[str] | None, exclude: Sequence[str]):
    """The series (one per value of the `hue` labels, default: the labels that vary besides
    `exclude`), their colours and markers, the models, and a figure with a panel per model."""
    hue = list(hue) if hue is not None else _varying_labels(settings, exclude=exclude)
    series = list(_groups(settings, hue))
    names = [name for name, _ in series]
    colours, shapes = palette(dict.fromkeys(names)), markers(dict.fromkeys(names))
    models = list(dict.fromkeys(settings[MODEL])) if MODEL in settings else [None]
    figure = new_figure(ncols=len(models), extra_width=LEGEND_WIDTH)
    axes = figure.subplots(1, len(models), squeeze=False)[0]
    return series, colours, shapes, models, figure, axes


def _log_limits(axis, values: Sequence[float]) -> None:
    """Log axis over the means, bar ends and dense line; a bar reaching zero or below (a wide
    CI of 3 seeds) is cut at the bottom instead of stretching the axis over decades."""
    positive = [v for v in values if np.isfinite(v) and v > 0]
    use_log_axis(axis, positive)
    if positive:
        axis.set_ylim(min(positive) / 1.1, max(positive) * 1.1)


def _x_axis(axis, settings: pd.DataFrame, x: str, categories: list[str] | None) -> None:
    if categories is not None:
        axis.set_xticks(range(len(categories)), categories)
        axis.set_xlim(-0.5, len(categories) - 0.5)
    else:
        ticks = sorted(settings["_x"].unique())
        if len(ticks) <= 12:
            axis.set_xticks(ticks, [f"{t:g}" for t in ticks])
    axis.set_xlabel(display_name(x))


def _varying_labels(settings: pd.DataFrame, exclude: Sequence[str]) -> list[str]:
    skip = set(exclude) | {MODEL}
    varying = [c for c in label_columns(settings)
               if c not in skip and label_varies(settings[c])]
    # The method, where it varies, is always named; of the rest, a label left at "none" by some
    # settings is the first left out where the others imply it (none_last).
    method = LABEL_PREFIX + "method"
    within = [c for c in (MODEL, method) if c in settings and (c == MODEL or c in varying)]
    rest = none_last(settings, [c for c in varying if c != method])
    kept = distinguishing_labels(settings.astype({c: str for c in varying}), rest, within=within)
    varying = [c for c in varying if c == method or c in kept]
    return varying or ([LABEL_PREFIX + "method"] if LABEL_PREFIX + "method" in settings else [])


def _groups(frame: pd.DataFrame, hue: Sequence[str]):
    if not hue:
        yield "", frame
        return
    for key, group in frame.groupby(list(hue), dropna=False, sort=True):
        key = key if isinstance(key, tuple) else (key,)
        yield " ".join(str(k) for k in key if not (isinstance(k, float) and math.isnan(k))), group
