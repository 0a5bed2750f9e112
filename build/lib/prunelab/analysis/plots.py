"""Study plots: a metric against a numeric label (sparsity, layers removed) per method, and
per-layer profiles (sparsity targets or layer scores).

Figures are built on `matplotlib.figure.Figure` with an Agg canvas, never through pyplot's global
state: that is thread-safe, needs no display, and the same Figure still renders inline in a
notebook. Inputs are the tidy summary from `tables.build_summary` (or a table.csv read back with
`tables.read_summary_csv`) and the loaded records.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from prunelab.analysis.records import LABEL_PREFIX, AnalysisError, RunRecord, label_columns

log = logging.getLogger(__name__)

ERROR_BARS = ("std", "ci", "none")


def plot_metric_vs(summary: pd.DataFrame, metric: str, x: str = "labels.sparsity",
                   hue: Sequence[str] | None = None, error: str = "std") -> Figure:
    """`metric` (mean over seeds) against the numeric label `x`, one line per method, one panel
    per model; error bars are the seed std or the 95% t-interval of the mean (error="ci").
    The dense reference is a dashed horizontal line."""
    if error not in ERROR_BARS:
        raise AnalysisError(f"unknown error bars {error!r}; use {', '.join(ERROR_BARS)}")
    x = x if x in summary.columns else LABEL_PREFIX + x
    if x not in summary.columns:
        raise AnalysisError(f"unknown x {x!r}; labels: {', '.join(label_columns(summary))}")
    part = summary[summary["metric"] == metric].copy()
    part["_x"] = pd.to_numeric(part[x], errors="coerce")
    settings = part[~part["is_dense"].astype(bool) & part["_x"].notna()]
    if settings.empty:
        raise AnalysisError(f"no numeric {x} values for {metric}")
    hue = list(hue) if hue is not None else _varying_labels(settings, exclude=(x,))
    model = LABEL_PREFIX + "model"
    models = list(dict.fromkeys(settings[model])) if model in settings else [None]
    figure = _figure(ncols=len(models))
    axes = figure.subplots(1, len(models), squeeze=False)[0]
    for axis, name in zip(axes, models):
        in_model = settings if name is None else settings[settings[model] == name]
        for line_name, line in _groups(in_model, hue):
            line = line.sort_values("_x")
            axis.errorbar(line["_x"], line["mean"], yerr=_error_bars(line, error), marker="o",
                          capsize=3, label=line_name)
        dense = part[part["is_dense"].astype(bool)]
        if name is not None and model in dense:
            dense = dense[dense[model] == name]
        for value in dense["mean"].head(1):
            axis.axhline(value, color="grey", linestyle="--", linewidth=1, label="dense")
        ticks = sorted(in_model["_x"].unique())
        if len(ticks) <= 12:
            axis.set_xticks(ticks)
        axis.set_xlabel(x.removeprefix(LABEL_PREFIX))
        axis.set_ylabel(metric)
        axis.set_title(str(name) if name is not None else metric)
        axis.grid(alpha=0.3)
        axis.legend(fontsize="small")
    return figure


def layer_profiles(records: Iterable[RunRecord], kind: str = "sparsity",
                   field: str = "target") -> pd.DataFrame:
    """Per-layer values, mean and std over seeds, one row per (signature, layer).

    kind="sparsity" reads `sparsity.per_layer[*][field]` (field: target or actual);
    kind="scores" reads `pruning.layer_scores` (a list, a {layer: score} dict, or a list of
    {layer, score} dicts). Columns: signature, label, layer, mean, std, n.
    """
    rows = []
    records = list(records)
    labels = _record_labels(records)
    for record in records:
        for layer, value in _layer_values(record, kind, field):
            rows.append({"signature": record.signature, "label": labels[record.signature],
                         "layer": layer, "value": value})
    if not rows:
        return pd.DataFrame(columns=["signature", "label", "layer", "mean", "std", "n"])
    frame = pd.DataFrame(rows)
    grouped = frame.groupby(["signature", "label", "layer"], sort=True)["value"]
    return grouped.agg(mean="mean", std="std", n="count").reset_index()


def plot_layer_profile(records: Iterable[RunRecord], kind: str = "sparsity",
                       field: str = "target") -> Figure:
    """Per-layer sparsity targets (or layer scores) per setting, mean over seeds with a +-std
    band; raises AnalysisError when no record has such data."""
    profiles = layer_profiles(records, kind, field)
    if profiles.empty:
        raise AnalysisError(f"no per-layer {kind} in the records")
    figure = _figure(ncols=1)
    axis = figure.subplots()
    for (label, _), profile in profiles.groupby(["label", "signature"], sort=True):
        axis.plot(profile["layer"], profile["mean"], marker=".", label=label)
        std = profile["std"].fillna(0.0)
        axis.fill_between(profile["layer"], profile["mean"] - std, profile["mean"] + std, alpha=0.2)
    axis.xaxis.set_major_locator(MaxNLocator(integer=True))
    axis.set_xlabel("layer")
    axis.set_ylabel(f"sparsity ({field})" if kind == "sparsity" else "layer score")
    axis.grid(alpha=0.3)
    if profiles["label"].nunique() <= 12:  # beside the axes: the profiles fill the plot
        axis.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.02, 1.0))
    return figure


def plot_matrix(matrix: Sequence[Sequence[float | None]], title: str, label: str = "similarity") -> Figure:
    """Heatmap of an all-pairs layer matrix (WRP similarity, swap-KL distances); None = not probed."""
    values = np.array([[np.nan if v is None else float(v) for v in row] for row in matrix])
    figure = _figure(1)
    ax = figure.add_subplot()
    image = ax.imshow(values, cmap="viridis", origin="upper")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # layer indices, not 2.5
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("layer j")
    ax.set_ylabel("layer i")
    ax.set_title(title)
    figure.colorbar(image, ax=ax, label=label)
    return figure


def save_figure(figure: Figure, path: str | Path, dpi: int = 150) -> Path:
    """Save a figure as PNG (Agg), creating the folder."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=dpi, bbox_inches="tight")
    return path


def slug(text: str) -> str:
    """A file-name-safe metric or label name: ppl/wikitext2/token -> ppl-wikitext2-token."""
    text = text.removeprefix(LABEL_PREFIX)
    cleaned = "".join(c if c.isalnum() or c in "-_." else "-" for c in text)
    return cleaned.strip("-") or "plot"


# --------------------------------------------------------------------------- helpers


def _figure(ncols: int) -> Figure:
    figure = Figure(figsize=(5.5 * ncols, 4), layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def _error_bars(line: pd.DataFrame, error: str):
    if error == "none":
        return None
    if error == "std":
        return line["std"].fillna(0.0).to_numpy()
    low = (line["mean"] - line["ci_low"]).fillna(0.0).to_numpy()
    high = (line["ci_high"] - line["mean"]).fillna(0.0).to_numpy()
    return np.vstack([low, high])


def _varying_labels(settings: pd.DataFrame, exclude: Sequence[str]) -> list[str]:
    skip = set(exclude) | {LABEL_PREFIX + "model"}
    varying = [c for c in label_columns(settings)
               if c not in skip and settings[c].astype(str).nunique() > 1]
    return varying or ([LABEL_PREFIX + "method"] if LABEL_PREFIX + "method" in settings else [])


def _groups(frame: pd.DataFrame, hue: Sequence[str]):
    if not hue:
        yield "", frame
        return
    for key, group in frame.groupby(list(hue), dropna=False, sort=True):
        key = key if isinstance(key, tuple) else (key,)
        yield " ".join(str(k) for k in key if not (isinstance(k, float) and math.isnan(k))), group


def _record_labels(records: Sequence[RunRecord]) -> dict[str, str]:
    keys = sorted({key for record in records for key in record.labels})
    varying = [k for k in keys if len({json.dumps(r.labels.get(k), default=str)
                                       for r in records}) > 1]
    shown = varying or [k for k in ("method",) if k in keys]
    return {r.signature: " ".join(str(r.labels.get(k, "")) for k in shown) or r.signature
            for r in records}


def _layer_values(record: RunRecord, kind: str, field: str) -> list[tuple[int, float]]:
    if kind == "sparsity":
        per_layer = (record.data.get("sparsity") or {}).get("per_layer") or []
        return [(int(item["layer"]), float(item[field])) for item in per_layer
                if isinstance(item, Mapping) and item.get(field) is not None]
    if kind == "scores":
        return _scores(record.data.get("pruning") or {})
    raise AnalysisError(f"unknown profile kind {kind!r}; use sparsity or scores")


def _scores(pruning: Mapping[str, Any]) -> list[tuple[int, float]]:
    scores = pruning.get("layer_scores")
    if isinstance(scores, Mapping):
        return sorted((int(layer), float(score)) for layer, score in scores.items())
    if isinstance(scores, list):
        pairs = []
        for i, item in enumerate(scores):
            if isinstance(item, Mapping):
                value = item.get("score", item.get("value"))
                if value is not None:
                    pairs.append((int(item.get("layer", i)), float(value)))
            elif item is not None:
                pairs.append((i, float(item)))
        return pairs
    return []
