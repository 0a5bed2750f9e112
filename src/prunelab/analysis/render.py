"""Rendering the summary for people: the formatted table, markdown, booktabs LaTeX.

Why separate from `tables`: the numbers (tables.build_summary, table.csv) should not depend on how
they are printed; this module only turns a summary frame into strings.
"""

from __future__ import annotations

import math
import re
from typing import Any, Sequence

import numpy as np
import pandas as pd

from prunelab.analysis.names import is_speedup
from prunelab.analysis.records import LABEL_PREFIX, label_columns, label_varies


def display_label_columns(summary: pd.DataFrame, always: Sequence[str] = ()) -> list[str]:
    """Label columns worth showing: model, method, any in `always`, those whose values differ
    across settings, and a label only some settings carry (refine "dsnot" on Wanda + DSnoT, none on
    Wanda) where it tells apart settings the others do not (a width method's own `structure` does
    not: the method already does)."""
    settings = summary[~summary["is_dense"].astype(bool)]
    columns = label_columns(summary)
    shown = [c for c in columns if c.removeprefix(LABEL_PREFIX) in ("model", "method") or c in always
             or settings[c].nunique() > 1]
    for column in columns:
        if column not in shown and label_varies(settings[column]) and len(
                settings.drop_duplicates(shown + [column])) > len(settings.drop_duplicates(shown)):
            shown.append(column)
    return [c for c in columns if c in shown]


def distinguishing_labels(settings: pd.DataFrame, columns: Sequence[str],
                          within: Sequence[str] = ()) -> list[str]:
    """`columns` less those implied by the others (within each group of `within`): a selector
    that follows from the scorer tells no setting apart, so a legend or a table need not show it.
    Later columns are dropped first."""
    kept = list(columns)
    for column in reversed(list(columns)):
        rest = [c for c in kept if c != column]
        if rest and len(settings.drop_duplicates(rest + list(within))) == len(
                settings.drop_duplicates(kept + list(within))):
            kept = rest
    return kept


def none_last(settings: pd.DataFrame, columns: Sequence[str]) -> list[str]:
    """`columns` with those some settings leave at "none" last (stable): such a label (recovery on
    the width arms) names a stage those settings skip, so where the others imply it,
    `distinguishing_labels`, which drops from the end, leaves it out first."""
    return sorted(columns, key=lambda c: bool((settings[c].astype(str) == "none").any()))


def format_table(summary: pd.DataFrame, decimals: int | None = None,
                 label_columns_shown: Sequence[str] | None = None, vs_dense: bool = False
                 ) -> tuple[pd.DataFrame, list[str]]:
    """The human table: one row per setting (dense rows included), label columns, then per metric
    "mean ± std (n)", for a speed-up also the median over seeds (timings are noisy: one slow
    run moves the mean), with `vs_dense` the change over dense ("+12.3 ± 0.4%") and, when compared
    with a baseline, "Δ [95% CI]", p (t), p (W) and p (Holm, t). Returns (table of strings,
    notes); notes explain NaN cells and refusals."""
    shown = list(label_columns_shown or display_label_columns(summary))
    settings = summary.loc[~summary["is_dense"].astype(bool), shown + ["setting"]]
    settings = settings.drop_duplicates("setting")
    if settings.duplicated(shown).any():  # labels do not tell some settings apart
        shown.append("setting")
    metrics = list(dict.fromkeys(summary["metric"]))
    compared = "p_t" in summary.columns
    prefix = len(metrics) > 1
    rows: dict[str, dict[str, str]] = {}
    notes: dict[str, dict[str, list[str]]] = {}
    for metric in metrics:
        part = summary[summary["metric"] == metric]
        digits = decimals if decimals is not None else choose_decimals(part["mean"])
        head = f"{metric} " if prefix else ""
        for _, row in part.iterrows():
            cells = rows.setdefault(row["setting"], {
                column.removeprefix(LABEL_PREFIX): text_of(row.get(column)) for column in shown})
            cells[metric] = format_mean(row, digits)
            if is_speedup(metric):
                cells[f"{head}median"] = format_median(row, digits)
            if vs_dense:
                cells[f"{head}vs dense"] = format_change(row)
            if compared:
                cells.update(_comparison_cells(row, digits, head))
            if row.get("note"):
                notes.setdefault(row["note"], {}).setdefault(metric, []).append(
                    _row_name(row, shown))
    table = pd.DataFrame(list(rows.values())).fillna("")
    compared_rows = ~summary["is_dense"].astype(bool)
    if "is_baseline" in summary.columns:
        compared_rows &= ~summary["is_baseline"].fillna(False).astype(bool)
    settings_of = {metric: int((compared_rows & (summary["metric"] == metric)).sum())
                   for metric in metrics}
    note_lines = [f"{note} ({_where(where, settings_of)})" for note, where in notes.items()]
    return table, note_lines


def _where(where: dict[str, list[str]], settings_of: dict[str, int], listed: int = 6) -> str:
    """Where a note applies, short enough to read: "every setting" for a metric it covers whole,
    otherwise the first `listed` rows and how many more (a sweep of 30 settings with a note on
    each would otherwise print a paragraph of row names)."""
    whole = [metric for metric, names in where.items() if len(names) >= settings_of[metric] > 1]
    if len(whole) == len(where):
        return "every setting" + ("" if len(where) == len(settings_of) and len(settings_of) == 1
                                  else f" [{', '.join(whole)}]")
    parts = [f"every setting [{', '.join(whole)}]"] if whole else []
    rows = [f"{name} [{metric}]" for metric, names in where.items() if metric not in whole
            for name in names]
    parts += rows[:listed]
    if len(rows) > listed:
        parts.append(f"and {len(rows) - listed} more")
    return "; ".join(parts)


def to_markdown(table: pd.DataFrame, notes: Sequence[str] = ()) -> str:
    """A markdown (pipe) table through tabulate (`DataFrame.to_markdown`), cells kept as the
    strings they are (no number re-parsing), numeric-looking columns right-aligned; notes below."""
    cells = table.map(lambda value: str(value).replace("|", "\\|"))
    cells.columns = [str(column).replace("|", "\\|") for column in table.columns]
    align = ["right" if _is_numeric_column(table[c]) else "left" for c in table.columns]
    text = cells.to_markdown(index=False, tablefmt="pipe", disable_numparse=True,
                             colalign=align) + "\n"
    if notes:
        text += "\nNotes:\n" + "".join(f"- {note}\n" for note in notes)
    return text


def to_latex(table: pd.DataFrame, notes: Sequence[str] = (), group_column: str = "model",
             bold: pd.DataFrame | None = None) -> str:
    """A booktabs `tabular` (for \\input inside a table environment) through pandas' Styler:
    text escaped for LaTeX, numeric-looking columns right-aligned, \\midrule between models,
    cells where `bold` is True in bold; notes as LaTeX comments above it."""
    spec = "".join("r" if _is_numeric_column(table[c]) else "l" for c in table.columns)
    styler = table.style.hide(axis="index").format(escape="latex").format_index(
        escape="latex", axis=1)
    if bold is not None:
        styler = styler.apply(lambda _: bold.replace({True: "font-weight: bold;",
                                                      False: ""}).to_numpy(), axis=None)
    body = styler.to_latex(hrules=True, column_format=spec, convert_css=bold is not None,
                           multicol_align="c")
    lines = body.splitlines()
    if group_column in table.columns:  # a rule before each model's block but the first
        first = lines.index("\\midrule") + 1
        groups = table[group_column].astype(str).tolist()
        for row in reversed(range(1, len(groups))):
            if groups[row] != groups[row - 1]:
                lines.insert(first + row, "\\midrule")
    comments = [f"% note: {note}" for note in notes]
    return latex_text("\n".join(comments + lines)) + "\n"


def latex_text(text: str) -> str:
    """Unicode that LaTeX's default fonts lack, as math: ±, Δ, ↑, ↓, <, >; en dash as --."""
    for char, latex in _LATEX_UNICODE.items():
        text = text.replace(char, latex)
    return text


def format_mean(row: pd.Series, digits: int, with_n: bool = True) -> str:
    """"mean ± std (n)" for a summary row; the dense row (and n=1) shows the value alone."""
    mean, std, n = row["mean"], row["std"], int(row["n"])
    if row.get("is_dense") or not np.isfinite(std):
        text = f"{mean:.{digits}f}"
    else:
        text = f"{mean:.{digits}f} ± {std:.{digits}f}"
    return f"{text} ({n})" if with_n and not row.get("is_dense") else text


def format_median(row: pd.Series, digits: int) -> str:
    """The median over seeds; empty for the dense row and for a table.csv written before
    medians were kept."""
    median = row.get("median", math.nan)
    if row.get("is_dense") or is_missing(median) or not np.isfinite(median):
        return ""
    return f"{median:.{digits}f}"


def format_change(row: pd.Series, with_std: bool = True) -> str:
    """The relative change over dense as a percentage ("+12.3 ± 0.4%"); empty for the dense row
    or when the model has no dense value."""
    change = row.get("vs_dense", math.nan)
    if row.get("is_dense") or is_missing(change) or not np.isfinite(change):
        return ""
    spread = row.get("vs_dense_std", math.nan)
    if with_std and not is_missing(spread) and np.isfinite(spread):
        return f"{100 * change:+.1f} ± {100 * spread:.1f}%"
    return f"{100 * change:+.1f}%"


def _comparison_cells(row: pd.Series, digits: int, head: str) -> dict[str, str]:
    if row.get("is_dense"):
        values = ["", "", "", ""]
    elif row.get("is_baseline"):
        values = ["baseline", "", "", ""]
    elif not np.isfinite(row["diff_mean"]):
        values = ["n/a", "", "", ""]
    else:
        interval = (f" [{row['diff_ci_low']:+.{digits}f}, {row['diff_ci_high']:+.{digits}f}]"
                    if np.isfinite(row["diff_ci_low"]) else "")
        values = [f"{row['diff_mean']:+.{digits}f}{interval}", p_text(row["p_t"]),
                  p_text(row["p_wilcoxon"]), p_text(row["p_t_holm"])]
    names = [f"{head}Δ [95% CI]", f"{head}p (t)", f"{head}p (W)", f"{head}p (Holm, t)"]
    return dict(zip(names, values))


def p_text(p: float) -> str:
    if not np.isfinite(p):
        return "–"
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def choose_decimals(values: pd.Series) -> int:
    """Decimals for a metric column: 1 from 100 up, 2 above 1 (perplexity), 3 below (accuracy)."""
    finite = values[np.isfinite(values.astype(float))].abs()
    largest = float(finite.max()) if len(finite) else 1.0
    return 1 if largest >= 100 else 2 if largest > 1 else 3


def _row_name(row: pd.Series, shown: Sequence[str]) -> str:
    parts = [text_of(row.get(column)) for column in shown]
    return " ".join(part for part in parts if part) or str(row["setting"])


def is_missing(value: Any) -> bool:
    """None, NaN or pd.NA."""
    return value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA


def text_of(value: Any) -> str:
    """A label value as table text: "" for missing, 2.0 -> "2", 0.5 -> "0.5"."""
    if is_missing(value):
        return ""
    if isinstance(value, float) and value.is_integer() and abs(value) >= 1:
        return str(int(value))
    return str(value)


def _is_numeric_column(column: pd.Series) -> bool:
    values = [v.strip("*") for v in column.astype(str) if v not in ("", "–", "n/a", "baseline")]
    return bool(values) and all(re.match(r"^[<+\-−]?\d", v) for v in values)


_LATEX_UNICODE = {"±": r"$\pm$", "Δ": r"$\Delta$", "–": "--", "↑": r"$\uparrow$",
                  "↓": r"$\downarrow$", "·": r"$\cdot$", "<": r"$<$", ">": r"$>$"}
