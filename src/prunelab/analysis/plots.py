"""Study plots: a metric against a label (sparsity, layers removed, sparsity pattern) per method,
per-layer profiles (in `profiles`, re-exported here) and all-pairs layer matrices.

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

from prunelab.analysis.names import direction, display_name, is_perplexity
from prunelab.analysis.profiles import layer_profiles, plot_layer_profile  # noqa: F401
from prunelab.analysis.records import LABEL_PREFIX, AnalysisError, label_columns
from prunelab.analysis.render import distinguishing_labels
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
    hue = list(hue) if hue is not None else _varying_labels(settings, exclude=(x,))
    series = list(_groups(settings, hue))
    names = [name for name, _ in series]
    colours, shapes = palette(dict.fromkeys(names)), markers(dict.fromkeys(names))
    models = list(dict.fromkeys(settings[MODEL])) if MODEL in settings else [None]
    figure = new_figure(ncols=len(models), extra_width=LEGEND_WIDTH)
    axes = figure.subplots(1, len(models), squeeze=False)[0]
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
        _x_axis(axis, settings if model is None else settings[settings[MODEL] == model], x,
                categories)
        if is_perplexity(metric):
            _log_limits(axis, shown)
        axis.set_ylabel(f"{display_name(metric)} {direction(part['higher_is_better'].iloc[0])}")
        axis.set_title(str(model) if model is not None else "")
        axis.grid(alpha=0.3, which="both" if is_perplexity(metric) else "major")
    handles, labels = axes[0].get_legend_handles_labels()
    for axis in axes[1:]:  # series missing from the first panel
        for handle, label in zip(*axis.get_legend_handles_labels()):
            if label not in labels:
                handles.append(handle)
                labels.append(label)
    figure.legend(handles, labels, loc="outside right center", fontsize="small",
                  title=error_caption(error, settings["n"]), title_fontsize="small")
    figure.suptitle(f"{display_name(metric)} vs {display_name(x).lower()}")
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
               if c not in skip and settings[c].astype(str).nunique() > 1]
    varying = distinguishing_labels(settings.astype({c: str for c in varying}), varying,
                                    within=[MODEL] if MODEL in settings else [])
    return varying or ([LABEL_PREFIX + "method"] if LABEL_PREFIX + "method" in settings else [])


def _groups(frame: pd.DataFrame, hue: Sequence[str]):
    if not hue:
        yield "", frame
        return
    for key, group in frame.groupby(list(hue), dropna=False, sort=True):
        key = key if isinstance(key, tuple) else (key,)
        yield " ".join(str(k) for k in key if not (isinstance(k, float) and math.isnan(k))), group
