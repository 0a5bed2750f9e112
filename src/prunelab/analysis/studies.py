"""The committed results as studies, for notebooks/01_results.ipynb: which table.csv files there
are (the testbed's `results/<study>/table.csv` and the real model's
`results/<study>/smollm2/table.csv`), how each study is laid out (its
`experiments/<study>/aggregate.args`, the recipe `make study` uses), and its paper table and main
figure.

Why here and not in the notebook: the notebook should only show things; code that decides what a
study is belongs where tests reach it. A study folder may be missing or half written while it is
being re-run (records present, tables not yet), so a table that cannot be read is skipped with a
warning instead of stopping the notebook.
"""

from __future__ import annotations

import logging
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import pandas as pd
from matplotlib.figure import Figure

from prunelab.analysis import outputs, paper, plots, tables
from prunelab.analysis.records import AnalysisError

log = logging.getLogger(__name__)

#: Where study tables live under results/: the testbed's, then each real model's folder.
TABLE_PATTERNS = ("*/table.csv", "*/smollm2/table.csv")


@dataclass(frozen=True)
class StudyTable:
    """One table.csv: `name` is "pals" (testbed) or "pals/smollm2" (real model), `study` is the
    experiments/ folder whose aggregate.args lays it out."""

    name: str
    study: str
    path: Path


@dataclass(frozen=True)
class Layout:
    """How a study is shown: paper-table rows and column, the x of its main figure, error bars."""

    rows: list[str]
    column: str
    plot_x: str | None
    error: str = "std"


def find_tables(results: str | Path, patterns: Sequence[str] = TABLE_PATTERNS) -> list[StudyTable]:
    """Every table.csv matching `patterns` under `results`, testbed before real model per study."""
    results = Path(results)
    found = {path for pattern in patterns for path in results.glob(pattern) if path.is_file()}
    studies = []
    for path in found:
        relative = path.parent.relative_to(results)
        studies.append(StudyTable(name=relative.as_posix(), study=relative.parts[0], path=path))
    return sorted(studies, key=lambda s: (s.study, s.name != s.study, s.name))


def missing_model_folders(results: str | Path, model: str = "smollm2") -> list[str]:
    """Studies with a testbed table but no `<model>/table.csv` (yet): re-runs in progress."""
    results = Path(results)
    return sorted(path.parent.name for path in results.glob("*/table.csv")
                  if not (path.parent / model / "table.csv").is_file())


def load_table(table: StudyTable) -> pd.DataFrame | None:
    """The summary in `table.path`, or None (with a warning) when it cannot be read: an empty,
    half-written or foreign file must not stop the notebook."""
    try:
        summary = tables.read_summary_csv(table.path)
    except (OSError, ValueError, pd.errors.ParserError) as error:
        log.warning("%s: skipped, unreadable (%s)", table.path, error)
        return None
    needed = {"setting", "metric", "mean", "std", "n", "is_dense", "higher_is_better"}
    if not needed <= set(summary.columns) or summary.empty:
        log.warning("%s: skipped, not a table.csv written by prunelab-aggregate", table.path)
        return None
    return summary


def study_layout(summary: pd.DataFrame, aggregate_args: str | Path | None = None) -> Layout:
    """The layout from the study's aggregate.args (--paper, else the first --pivot; --plot-x;
    --error), falling back to `paper.default_layout` where it names none or does not exist."""
    from prunelab.analysis.cli import build_parser  # the recipe's own parser

    args = None
    if aggregate_args is not None and Path(aggregate_args).is_file():
        text = Path(aggregate_args).read_text(encoding="utf-8")
        args, _ = build_parser().parse_known_args(shlex.split(text))
    spec = (args.paper or next(iter(args.pivot), None)) if args else None
    rows, column = outputs.split_spec(spec) if spec else paper.default_layout(summary)
    x = outputs.plot_x(summary, args.plot_x if args else None) or _as_label(summary, column)
    return Layout(rows=rows, column=column, plot_x=x, error=args.error if args else "std")


def paper_markdown(summary: pd.DataFrame, layout: Layout) -> str:
    """The study's paper table in markdown (caption above)."""
    return paper.paper_markdown(paper.paper_table(summary, layout.rows, layout.column))


def main_figure(summary: pd.DataFrame, layout: Layout) -> Figure | None:
    """The study's main figure: its first perplexity against the layout's x; None (with a
    warning) when there is nothing to plot."""
    if layout.plot_x is None:
        return None
    try:
        return plots.plot_metric_vs(summary, plots.main_metric(summary), x=layout.plot_x,
                                    error=layout.error)
    except AnalysisError as error:
        log.warning("no main figure: %s", error)
        return None


def _as_label(summary: pd.DataFrame, column: str) -> str | None:
    name = column if column in summary.columns else "labels." + column
    return name if name in summary.columns else None
