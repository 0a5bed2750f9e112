"""The paper-table preset: methods as rows, settings as columns, "mean ± std" cells, the best
value of each column in bold; written as paper_table.md and paper_table.tex beside table.md.

Why a preset: the full-detail table (table.md, one column per statistic and metric) is for
checking a claim; a paper needs the claim itself in a few columns. The rows and the column are
the study's `--pivot ROW[,ROW...],COLUMN` labels (e.g. allocation x sparsity), one column group
per metric, the dense model as the first row. Best is judged per model and column among the
pruned settings on the displayed (rounded) means, in the metric's own direction (lowest
perplexity, highest accuracy); a column with a single setting has no best.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from prunelab.analysis.dense import DENSE_METHOD
from prunelab.analysis.names import direction, display_name, short_name
from prunelab.analysis.records import LABEL_PREFIX, AnalysisError, label_varies, select_label_columns
from prunelab.analysis.render import choose_decimals, text_of, to_latex, to_markdown
from prunelab.analysis.tables import numeric_first

MODEL = LABEL_PREFIX + "model"
MISSING = "–"


@dataclass(frozen=True)
class PaperTable:
    """Cells (strings; row labels first, then one column per metric and setting), which cells
    are the best of their column, and the caption saying how to read them."""

    cells: pd.DataFrame
    best: pd.DataFrame
    caption: str


def paper_table(summary: pd.DataFrame, rows: Sequence[str], column: str,
                metrics: Sequence[str] | None = None, decimals: int | None = None) -> PaperTable:
    """The preset table of `summary`: one row per value of the `rows` labels (the model first
    when there are several), one column per metric and value of `column`."""
    rows, column = list(select_label_columns(list(rows), summary, absent="skip")), select_label_columns(
        [column], summary)[0]
    settings = summary[~summary["is_dense"].astype(bool)]
    models = list(dict.fromkeys(summary[MODEL].dropna())) if MODEL in summary else []
    rows = [r for r in rows if r != MODEL and r != column]
    varying = [r for r in rows if label_varies(settings[r])]
    rows = ([MODEL] if len(models) > 1 else []) + (varying or rows[:1])
    metrics = list(metrics or dict.fromkeys(summary["metric"]))
    values = sorted(settings[column].dropna().unique(), key=numeric_first)
    headers = [_header(metric, summary, column, value) for metric in metrics for value in values]
    keys = _row_keys(summary, rows)
    cells = pd.DataFrame(MISSING, index=range(len(keys)), columns=headers)
    means = pd.DataFrame(np.nan, index=range(len(keys)), columns=headers)
    for metric in metrics:
        part = summary[summary["metric"] == metric]
        if part.empty:
            raise AnalysisError(f"unknown metric {metric!r} for the paper table")
        digits = decimals if decimals is not None else choose_decimals(part["mean"])
        for i, key in enumerate(keys):
            for value in values:
                row = _find(part, rows, key, column, value)
                if row is not None:
                    header = _header(metric, summary, column, value)
                    cells.loc[i, header] = _cell(row, digits)
                    means.loc[i, header] = round(float(row["mean"]), digits)
    best = _best(means, keys, rows, metrics, summary, len(values))
    labels = pd.DataFrame([[text_of(part) for part in key[1]] for key in keys],
                          columns=[short_name(r) for r in rows])
    seeds = sorted({int(n) for n in settings["n"]}) if len(settings) else [0]
    over = f"{seeds[0]}" if seeds[0] == seeds[-1] else f"{seeds[0]}–{seeds[-1]}"
    where = "each model's column" if len(models) > 1 else "each column"
    caption = (f"Mean ± std over {over} seeds; columns: {display_name(column).lower()}; the best "
               f"(rounded) mean of {where} in bold; dense = the unpruned model. "
               + "; ".join(f"{short_name(m)}: {display_name(m)}" for m in metrics) + ".")
    return PaperTable(pd.concat([labels, cells], axis=1),
                      pd.concat([pd.DataFrame(False, index=labels.index, columns=labels.columns),
                                 best], axis=1), caption)


def paper_markdown(table: PaperTable) -> str:
    """The table in markdown (tabulate), best cells in **bold**, the caption above."""
    cells = table.cells.where(~table.best, "**" + table.cells + "**")
    return f"{table.caption}\n\n" + to_markdown(cells)


def paper_latex(table: PaperTable) -> str:
    """The table as a booktabs tabular (pandas Styler), best cells \\bfseries, caption as a
    comment above."""
    cells, best = table.cells.copy(), table.best.copy()
    columns = pd.MultiIndex.from_tuples([tuple(c.split(" · ", 1)) if " · " in c else (c, "")
                                         for c in cells.columns])
    cells.columns = best.columns = columns
    group = (short_name("model"), "")
    return f"% {table.caption}\n" + to_latex(cells, group_column=group, bold=best)


def default_layout(summary: pd.DataFrame) -> tuple[list[str], str]:
    """Rows and column for a study without a `--pivot`: the column is the first of sparsity,
    layers removed, sparsity pattern that varies; the rows are the other labels that vary
    (method when none does)."""
    settings = summary[~summary["is_dense"].astype(bool)]
    varying = [c for c in settings.columns if c.startswith(LABEL_PREFIX)
               and c not in (MODEL, LABEL_PREFIX + "calibration")
               and label_varies(settings[c])]
    candidates = [LABEL_PREFIX + n for n in ("sparsity", "layers_removed", "sparsity_type")]
    column = next((c for c in candidates if c in varying), None)
    if column is None:
        raise AnalysisError("no setting label varies: nothing to lay out as columns")
    rows = [c for c in varying if c != column] or [LABEL_PREFIX + "method"]
    return rows, column


def write_paper_table(summary: pd.DataFrame, out: str | Path, rows: Sequence[str], column: str,
                      formats: Sequence[str] = ("md", "tex"), decimals: int | None = None,
                      metrics: Sequence[str] | None = None) -> list[Path]:
    """Write paper_table.md / paper_table.tex (whichever of `formats` are md or tex)."""
    table = paper_table(summary, rows, column, metrics=metrics, decimals=decimals)
    written = []
    for fmt, render in (("md", paper_markdown), ("tex", paper_latex)):
        if fmt in formats:
            path = Path(out) / f"paper_table.{fmt}"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(render(table), encoding="utf-8")
            written.append(path)
    return written


# --------------------------------------------------------------------------- helpers


def _header(metric: str, summary: pd.DataFrame, column: str, value: Any) -> str:
    higher = summary.loc[summary["metric"] == metric, "higher_is_better"]
    arrow = direction(higher.iloc[0]) if len(higher) else ""
    return f"{short_name(metric)} {arrow} · {setting_text(column, value)}".replace("  ", " ")


def setting_text(column: str, value: Any) -> str:
    """A column's setting as a header: sparsity 0.5 -> "50%", 20% of the parameters removed ->
    "20% params", 4 layers removed -> "4 layers"."""
    name = column.removeprefix(LABEL_PREFIX)
    number = pd.to_numeric(pd.Series([value]), errors="coerce").iloc[0]
    if name == "sparsity" and np.isfinite(number):
        return f"{100 * number:g}%"
    if name == "params_removed" and np.isfinite(number):
        return f"{100 * number:g}% params"
    if name == "layers_removed" and np.isfinite(number):
        return f"{number:g} layers"
    return text_of(value)


def _row_keys(summary: pd.DataFrame, rows: list[str]) -> list[tuple[bool, tuple]]:
    """(is_dense, label values) per table row, in order: per model, its dense row ("dense" in
    the first label after the model), then its settings sorted by label (numbers as numbers)."""
    keys = list(dict.fromkeys(_row_key(row, rows) for _, row in summary.iterrows()))
    by_model = rows[:1] == [MODEL]
    model_order = {m: i for i, m in enumerate(dict.fromkeys(k[1][0] for k in keys))}
    return sorted(keys, key=lambda key: (model_order[key[1][0]] if by_model else 0, not key[0],
                                         tuple(numeric_first(v) for v in key[1])))


def _row_key(row: pd.Series, rows: list[str]) -> tuple[bool, tuple]:
    if not row["is_dense"]:
        return False, tuple(row[r] for r in rows)
    values: list[Any] = []
    for label in rows:
        values.append(row[label] if label == MODEL else
                      "" if DENSE_METHOD in values else DENSE_METHOD)
    return True, tuple(values)


def _find(part: pd.DataFrame, rows: list[str], key: tuple[bool, tuple], column: str,
          value: Any) -> pd.Series | None:
    dense, values = key
    if dense:
        found = part[part["is_dense"].astype(bool)]
        if rows and rows[0] == MODEL:
            found = found[found[MODEL] == values[0]]
    else:
        found = part[~part["is_dense"].astype(bool) & (part[column] == value)]
        for label, wanted in zip(rows, values):
            found = found[_equal(found[label], wanted)]
    if len(found) > 1 and not dense:
        raise AnalysisError("paper table is ambiguous: several settings share "
                            f"{', '.join(r.removeprefix(LABEL_PREFIX) for r in rows + [column])};"
                            " add a label to the rows")
    return found.iloc[0] if len(found) else None


def _equal(labels: pd.Series, wanted: Any) -> pd.Series:
    """Which labels equal `wanted`, a missing label (a width method's scorer) equal to a missing
    one: pandas 3 keeps NaN missing through astype(str), so "nan" == "nan" no longer matches."""
    if pd.isna(wanted):
        return labels.isna()
    return labels.astype(str) == str(wanted)


def _cell(row: pd.Series, digits: int) -> str:
    if row["is_dense"] or not np.isfinite(row["std"]):
        return f"{row['mean']:.{digits}f}"
    return f"{row['mean']:.{digits}f} ± {row['std']:.{digits}f}"


def _best(means: pd.DataFrame, keys: list, rows: list[str], metrics: Sequence[str],
          summary: pd.DataFrame, per_metric: int) -> pd.DataFrame:
    best = pd.DataFrame(False, index=means.index, columns=means.columns)
    blocks = [key[1][0] if rows and rows[0] == MODEL else None for key in keys]
    pruned = pd.Series([not key[0] for key in keys], index=means.index)
    for j, header in enumerate(means.columns):
        metric = metrics[j // per_metric]
        higher = summary.loc[summary["metric"] == metric, "higher_is_better"].iloc[0]
        higher = str(higher).lower() == "true"
        for block in dict.fromkeys(blocks):
            mask = pruned & pd.Series([b == block for b in blocks], index=means.index)
            column = means.loc[mask, header].dropna()
            if len(column) < 2:
                continue
            target = column.max() if higher else column.min()
            best.loc[column.index[column == target], header] = True
    return best
