"""Results tables: settings x metrics, "mean ± std (n)" over seeds, tested against a baseline.

Why this shape: a paper claim is a comparison across seeds against a named baseline at the same
model and sparsity, with the dense model as reference. `build_summary` computes that as a tidy
frame (one row per setting and metric, all numbers kept, written as table.csv);
`render.format_table` turns it into the human table (table.md / table.tex); `pivot` gives the
paper-style "method x sparsity" grid. The tests against a baseline live in `baseline`, the
item-level test of two single runs in `compare`.
"""

from __future__ import annotations

import fnmatch
import logging
import math
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
import pandas as pd

from prunelab.analysis import stats
from prunelab.analysis.baseline import COMPARISON_COLUMNS, add_baseline_comparisons
from prunelab.analysis.dense import DENSE_METHOD, add_change_over_dense, dense_reference  # noqa: F401
from prunelab.analysis.records import (
    LABEL_PREFIX,
    AnalysisError,
    label_columns,
    label_order,
    select_label_columns,
)

# format_table, to_markdown, to_latex and display_label_columns are re-exported for callers.
from prunelab.analysis.render import (  # noqa: F401
    choose_decimals,
    display_label_columns,
    format_change,
    format_mean,
    format_table,
    is_missing,
    text_of,
    to_latex,
    to_markdown,
)

log = logging.getLogger(__name__)

DEFAULT_GROUP_BY = ("signature",)
#: The numbers over a setting's seeds, then those of the comparison with a baseline.
SEED_COLUMNS = ("n", "mean", "median", "std", "ci_low", "ci_high")
SUMMARY_NUMBER_COLUMNS = (*SEED_COLUMNS, *COMPARISON_COLUMNS)


# --------------------------------------------------------------------------- metrics


def available_metrics(frame: pd.DataFrame) -> list[str]:
    """Metric keys present in the frame, sorted."""
    return sorted(frame["metric"].dropna().unique()) if "metric" in frame else []


def select_metrics(frame: pd.DataFrame, requested: Sequence[str] | None,
                   optional: Sequence[str] = ()) -> list[str]:
    """The requested metric keys (shell-style patterns allowed, e.g. `ppl/*`), or all of them;
    then the `optional` ones these records carry (a study's speed-ups or zero-shot average, which
    some backbones' protocols leave out).

    Raises AnalysisError naming the available metrics when a request matches none (an optional
    one is left out instead), or when nothing at all is chosen.
    """
    available = available_metrics(frame)
    if not available:
        raise AnalysisError("the records carry no metrics")
    if not requested and not optional:
        return available
    chosen: list[str] = []
    for pattern in requested or ():
        matches = fnmatch.filter(available, pattern)
        if not matches:
            raise AnalysisError(
                f"unknown metric {pattern!r}; available: {', '.join(available) or 'none'}")
        chosen += [metric for metric in matches if metric not in chosen]
    for pattern in optional:
        chosen += [metric for metric in fnmatch.filter(available, pattern) if metric not in chosen]
    if not chosen:
        raise AnalysisError(f"none of the optional metrics {', '.join(optional)} is in these records; "
                            f"available: {', '.join(available)}")
    return chosen


# --------------------------------------------------------------------------- summary


def build_summary(frame: pd.DataFrame, metrics: Sequence[str] | None = None,
                  group_by: Sequence[str] | None = None, baseline: str | None = None,
                  match_on: Sequence[str] | None = None, confidence_level: float = 0.95,
                  n_resamples: int = stats.DEFAULT_N_RESAMPLES,
                  seed: int = stats.DEFAULT_SEED) -> pd.DataFrame:
    """The tidy table: one row per (setting, metric), plus one dense reference row per
    (model, metric).

    A setting is one value of `group_by` (default: the record signature, i.e. everything but the
    seed). Columns: setting, labels.*, metric, higher_is_better, n, seeds, mean, median (robust
    to one odd seed, e.g. a timing taken on a busy machine), std (ddof=1), ci_low/ci_high
    (t-interval of the mean), stamp, is_dense, note; with a `baseline` selector
    (see `resolve_baseline`) also is_baseline, baseline, n_pairs, baseline_mean, diff_mean
    (setting - baseline), diff_ci_low/high (paired bootstrap), t_statistic, p_t, w_statistic,
    p_wilcoxon and the Holm-adjusted p_t_holm / p_wilcoxon_holm over all comparisons in the table.
    """
    metrics = select_metrics(frame, metrics)
    group_by = select_label_columns(group_by or DEFAULT_GROUP_BY, frame)
    data = frame[frame["metric"].isin(metrics)]
    missing = data["value"].isna()
    if missing.any():
        log.warning("ignored %d metric value(s) that are null: %s", int(missing.sum()),
                    ", ".join(sorted(set(data.loc[missing, "source"].astype(str))))[:300])
        data = data[~missing]
    settings = [_setting_row(rows, group_by, key)
                for key, rows in data.groupby(group_by + ["metric"], dropna=False, sort=False)]
    summary = pd.DataFrame(settings)
    if baseline:
        summary = add_baseline_comparisons(summary, data, baseline, match_on, confidence_level,
                                           n_resamples, seed)
    dense = dense_reference(data, metrics)
    if not dense.empty:
        summary = add_change_over_dense(pd.concat([dense, summary], ignore_index=True), data)
    if "is_baseline" in summary:
        summary["is_baseline"] = summary["is_baseline"].fillna(False).astype(bool)
    return order_rows(summary, metrics)


def _setting_row(rows: pd.DataFrame, group_by: list[str], key: tuple) -> dict[str, Any]:
    values = rows["value"].astype(float).to_numpy()
    ci_low, ci_high = stats.mean_confidence_interval(values)
    notes = []
    stamps = rows["stamp"].value_counts(dropna=False)
    if len(stamps) > 1:
        first, second = (rows.loc[rows["stamp"] == stamp, "protocol"].iloc[0]
                         for stamp in stamps.index[:2])
        differences = "; ".join(stats.protocol_differences(first, second))
        notes.append(f"setting mixes protocols ({differences}); not compared")
    duplicated = sorted(rows.loc[rows["seed"].duplicated(), "seed"].unique())
    if duplicated:
        notes.append(f"seed(s) {duplicated} appear in more than one record; not compared")
    row: dict[str, Any] = {
        "setting": _setting_name(group_by, key[:-1]),
        **{column: _common_value(rows[column]) for column in label_columns(rows)},
        "metric": key[-1], "higher_is_better": _common_value(rows["higher_is_better"]),
        "n": len(values), "seeds": ",".join(map(str, sorted(rows["seed"]))),
        "mean": float(np.mean(values)), "median": float(np.median(values)),
        "std": float(np.std(values, ddof=1)) if len(values) > 1 else math.nan,
        "ci_low": ci_low, "ci_high": ci_high, "stamp": _common_value(rows["stamp"]),
        "signatures": ",".join(sorted(rows["signature"].unique())),
        "is_dense": False, "note": "; ".join(notes),
    }
    return row


# --------------------------------------------------------------------------- ordering / display


def order_rows(summary: pd.DataFrame, metrics: Sequence[str] | None = None) -> pd.DataFrame:
    """Rows by model, dense reference first, then by the labels (numbers sorted as numbers),
    metric order as requested."""
    if summary.empty:
        return summary
    summary = summary.copy()
    summary["_dense_last"] = ~summary["is_dense"].astype(bool)
    order = {metric: i for i, metric in enumerate(metrics or available_metrics(summary))}
    summary["_metric_order"] = summary["metric"].map(order)
    keys = ([LABEL_PREFIX + "model"] if LABEL_PREFIX + "model" in summary else [])
    keys += ["_dense_last"] + [c for c in label_columns(summary) if c not in keys]
    keys += ["setting", "_metric_order"]
    summary = summary.sort_values(keys, key=_sort_key, na_position="first", kind="stable")
    summary = summary.drop(columns=["_dense_last", "_metric_order"]).reset_index(drop=True)
    return summary[_column_order(summary)]


def _column_order(summary: pd.DataFrame) -> list[str]:
    labels = sorted(label_columns(summary), key=label_order)
    first = ["setting", *labels, "metric", "higher_is_better", *SEED_COLUMNS,
             "seeds", "is_dense", "is_baseline", "baseline", *COMPARISON_COLUMNS]
    last = ["note", "stamp", "signatures"]
    present = [c for c in first if c in summary.columns]
    rest = [c for c in summary.columns if c not in present and c not in last]
    return present + rest + [c for c in last if c in summary.columns]


def pivot(summary: pd.DataFrame, index: Sequence[str] | str, columns: str, metric: str,
          values: str = "cell", decimals: int | None = None, vs_dense: bool = False
          ) -> pd.DataFrame:
    """Paper-style grid for one metric, e.g. index=labels.method, columns=labels.sparsity.

    values="cell" gives "mean ± std" strings (with `vs_dense`, followed by the change over dense,
    "2.45 ± 0.01 (+11.2%)"), any summary column (mean, vs_dense, diff_mean, p_t_holm...) gives
    numbers. The dense reference becomes a row repeated under every column. The model is
    added to the index when the summary holds several.
    """
    index = [index] if isinstance(index, str) else list(index)
    index, columns = select_label_columns(index, summary, absent="skip"), select_label_columns([columns],
                                                                                summary)[0]
    model = LABEL_PREFIX + "model"
    if model in summary and summary[model].nunique() > 1 and model not in index:
        index = [model] + index
    part = summary[summary["metric"] == metric].copy()
    if part.empty:
        raise AnalysisError(f"unknown metric {metric!r} for pivot")
    digits = decimals if decimals is not None else choose_decimals(part["mean"])
    part["cell"] = [format_mean(row, digits, with_n=False) for _, row in part.iterrows()]
    if vs_dense:
        part["cell"] = [cell + (f" ({change})" if (change := format_change(row, with_std=False))
                                else "") for cell, (_, row) in zip(part["cell"], part.iterrows())]
    settings, dense = part[~part["is_dense"]], part[part["is_dense"]]
    duplicated = settings.duplicated(index + [columns], keep=False)
    if duplicated.any():
        raise AnalysisError(
            f"pivot is ambiguous: several settings share {', '.join(index + [columns])}; "
            "add a label to the index (e.g. allocation)")
    grid = settings.pivot(index=index, columns=columns, values=values)
    grid = grid[sorted(grid.columns, key=numeric_first)]
    if not dense.empty:
        dense_rows = []
        for _, row in dense.iterrows():
            label = tuple(row[c] if c == model else DENSE_METHOD for c in index)
            dense_rows.append(pd.Series({c: row[values] for c in grid.columns},
                                        name=label if len(index) > 1 else label[0]))
        grid = pd.concat([pd.DataFrame(dense_rows), grid])
        if len(index) > 1:
            grid.index = pd.MultiIndex.from_tuples(grid.index, names=index)
            if index[0] == model:  # each model's dense row heads its block
                order = sorted(range(len(grid)), key=lambda i: str(grid.index[i][0]))
                grid = grid.iloc[order]
        else:
            grid.index.name = index[0]
    grid.columns.name = columns
    return grid


def pivot_for_output(grid: pd.DataFrame) -> pd.DataFrame:
    """A pivot grid flattened to plain columns (index levels first) for md/tex/csv output."""
    flat = grid.reset_index()
    flat.columns = [text_of(c).removeprefix(LABEL_PREFIX) for c in flat.columns]
    return flat.map(text_of)


def write_outputs(summary: pd.DataFrame, out_dir: str | Path,
                  formats: Iterable[str] = ("md", "tex", "csv"), name: str = "table",
                  decimals: int | None = None, vs_dense: bool = False) -> dict[str, Path]:
    """Write `<name>.md` / `.tex` (formatted) and `.csv` (the tidy numeric summary)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    table, notes = format_table(summary, decimals, vs_dense=vs_dense)
    written = {}
    for fmt in formats:
        path = out_dir / f"{name}.{fmt}"
        if fmt == "md":
            path.write_text(to_markdown(table, notes), encoding="utf-8")
        elif fmt == "tex":
            path.write_text(to_latex(table, notes), encoding="utf-8")
        elif fmt == "csv":
            summary.to_csv(path, index=False)
        else:
            raise AnalysisError(f"unknown format {fmt!r}; use md, tex, csv")
        written[fmt] = path
    return written


def read_summary_csv(path: str | Path) -> pd.DataFrame:
    """Read a table.csv written by `write_outputs` back into a summary frame."""
    summary = pd.read_csv(path, dtype={"setting": str, "seeds": str, "signatures": str,
                                       "baseline": str, "note": str, "stamp": str})
    for column in ("is_dense", "is_baseline"):
        if column in summary:
            summary[column] = summary[column].astype(str).str.lower().eq("true")
    for column in ("note", "baseline", "seeds", "signatures", "stamp"):
        if column in summary:
            summary[column] = summary[column].fillna("")
    return summary


# --------------------------------------------------------------------------- helpers


def _setting_name(group_by: Sequence[str], values: tuple) -> str:
    if list(group_by) == ["signature"]:
        return str(values[0])
    return ", ".join(f"{column.removeprefix(LABEL_PREFIX)}={text_of(value)}"
                     for column, value in zip(group_by, values))


def _common_value(series: pd.Series) -> Any:
    unique = series.dropna().unique()
    if len(unique) == 1:
        return unique[0]
    return "|".join(sorted(map(str, unique))) if len(unique) else None


def _sort_key(series: pd.Series) -> pd.Series:
    if series.dtype == bool:
        return series
    numeric = pd.to_numeric(series, errors="coerce")
    if numeric[series.notna()].notna().all():
        return numeric
    return series.astype(str)


def numeric_first(value: Any) -> tuple:
    """Sort key: numbers (as numbers) before text."""
    try:
        return (0, float(value), "")
    except (TypeError, ValueError):
        return (1, 0.0, str(value))

