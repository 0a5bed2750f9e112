"""A study's files beside table.csv: pivots, the paper-table preset, metric plots,
quality-versus-speed plots and per-layer profiles, each a pure step from the summary (and the
records, for the profiles) to files.

Why apart from `cli`: the command line only parses arguments; what a study folder holds is
decided here, so the same files come out whether the summary was built from records or read
back from a committed table.csv (`prunelab-aggregate --from-table`).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Sequence

import pandas as pd

from prunelab.analysis import paper, plots, tables
from prunelab.analysis.names import is_quality
from prunelab.analysis.records import LABEL_PREFIX, AnalysisError, RunRecord

log = logging.getLogger("prunelab.analysis")

DEFAULT_PLOT_X = ("labels.sparsity", "labels.layers_removed")
#: Speed-ups each quality metric is plotted against, when the summary holds them.
SPEED_METRICS = ("speedup/prefill", "speedup/decode")
PROFILES = (("sparsity", "layer_sparsity.png"), ("scores", "layer_scores.png"))


def split_spec(spec: str, option: str = "--pivot") -> tuple[list[str], str]:
    """"allocation,sparsity" -> (["allocation"], "sparsity"); AnalysisError for one name."""
    names = [part.strip() for part in spec.split(",") if part.strip()]
    if len(names) < 2:
        raise AnalysisError(f"{option} {spec!r}: give ROW[,ROW...],COLUMN")
    return names[:-1], names[-1]


def write_pivots(summary: pd.DataFrame, metrics: Sequence[str], spec: str, out: Path,
                 formats: Sequence[str], decimals: int | None, vs_dense: bool) -> list[Path]:
    """pivot_<column>_<metric>.md/.tex/.csv: one "rows x column" grid per metric."""
    rows, column = split_spec(spec)
    written = []
    for metric in metrics:
        grid = tables.pivot(summary, rows, column, metric, decimals=decimals, vs_dense=vs_dense)
        flat = tables.pivot_for_output(grid)
        stem = f"pivot_{plots.slug(column)}_{plots.slug(metric)}"
        for fmt in formats:
            path = out / f"{stem}.{fmt}"
            if fmt == "md":
                path.write_text(tables.to_markdown(flat), encoding="utf-8")
            elif fmt == "tex":
                path.write_text(tables.to_latex(flat), encoding="utf-8")
            else:
                grid.to_csv(path)
            written.append(path)
    return written


def write_paper(summary: pd.DataFrame, metrics: Sequence[str], spec: str | None, out: Path,
                formats: Sequence[str], decimals: int | None) -> list[Path]:
    """paper_table.md/.tex laid out by `spec` (ROW[,ROW...],COLUMN), else by
    `paper.default_layout`; nothing (with a log line) when no label varies."""
    try:
        rows, column = split_spec(spec, "--paper") if spec else paper.default_layout(summary)
    except AnalysisError as error:
        if spec:
            raise
        log.info("no paper table: %s", error)
        return []
    return paper.write_paper_table(summary, out, rows, column, formats=formats,
                                   decimals=decimals, metrics=metrics)


def plot_x(summary: pd.DataFrame, requested: str | None) -> str | None:
    """The label for metric plots: `requested`, else sparsity or layers removed if it varies."""
    if requested:
        column = requested if requested in summary.columns else LABEL_PREFIX + requested
        if column not in summary.columns:
            raise AnalysisError(f"unknown --plot-x {requested!r}; labels: "
                                + ", ".join(c for c in summary.columns if c.startswith("labels.")))
        return column
    settings = summary[~summary["is_dense"].astype(bool)]
    for column in DEFAULT_PLOT_X:
        if column in settings and pd.to_numeric(settings[column], errors="coerce").nunique() > 1:
            return column
    return None


def write_plots(summary: pd.DataFrame, records: Sequence[RunRecord] | None,
                metrics: Sequence[str], x: str | None, error: str, out: Path) -> list[Path]:
    """<metric>_vs_<x>.png per metric, <quality>_vs_<speed-up>.png (see `write_tradeoff_plots`),
    and layer_sparsity.png / layer_scores.png from the records (skipped when there are none: a
    summary read back from table.csv has no per-layer data)."""
    written = []
    if x is not None:
        for metric in metrics:
            try:
                figure = plots.plot_metric_vs(summary, metric, x=x, error=error)
            except AnalysisError as error_:
                log.warning("no plot for %s: %s", metric, error_)
                continue
            name = f"{plots.slug(metric)}_vs_{plots.slug(x)}.png"
            written.append(plots.save_figure(figure, out / name))
    written += write_tradeoff_plots(summary, metrics, error, out)
    if records is None:
        log.info("no layer profiles: no records (summary read from a table)")
        return written
    for kind, name in PROFILES:
        try:
            figure = plots.plot_layer_profile(records, kind=kind)
        except AnalysisError as error_:
            log.info("no layer profile: %s", error_)
            continue
        written.append(plots.save_figure(figure, out / name))
    return written


def write_tradeoff_plots(summary: pd.DataFrame, metrics: Sequence[str], error: str,
                         out: Path) -> list[Path]:
    """<quality>_vs_<speed-up>.png for each quality metric among `metrics` (perplexity, the
    zero-shot average) and each speed-up the summary holds (SPEED_METRICS); nothing for a study
    without speed-ups, so its folder holds the files it always did."""
    present = set(summary["metric"])
    written = []
    for speed in (metric for metric in SPEED_METRICS if metric in present):
        for quality in (metric for metric in metrics if is_quality(metric)):
            try:
                figure = plots.plot_quality_vs_speed(summary, quality, speed, error=error)
            except AnalysisError as error_:
                log.warning("no %s vs %s plot: %s", quality, speed, error_)
                continue
            name = f"{plots.slug(quality)}_vs_{plots.slug(speed)}.png"
            written.append(plots.save_figure(figure, out / name))
    return written
