"""One study on several models, side by side: a row per setting, a column per model.

Why: the testbed models check a method's mechanics and a real pretrained model checks the paper's
claim (the testbed lacks massive activations), so a reader wants both answers in one table. The
models are evaluated on different text, so their perplexities are not comparable in absolute
terms: each cell gives the model's own mean, its change over that model's dense value and, where
the study compares with a baseline, the paired p (t-test over seeds). The inputs are the
`table.csv` files `prunelab-aggregate` wrote, so nothing is recomputed here.

Compact by construction: only labels that tell settings apart are columns (one that follows from
another, like the selector of a scorer, is dropped), and depth settings are joined across models
by their rank (each model's lighter and heavier removal), the counts shown per model ("4 / 6"),
so a row is filled for every model that ran it.

    python -m prunelab.analysis.by_model results/pals/table.csv results/pals/smollm2/table.csv \
        --out results/pals/by_model.md --figure results/pals/by_model.png

The figure (`backbone_figure`) draws the main metric against the study's ladder (sparsity or layers
removed), one panel per model, so a dependence on the architecture is visible at a glance.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from prunelab.analysis.plots import LADDER_LABELS, main_metric, plot_metric_vs, save_figure
from prunelab.analysis.records import LABEL_PREFIX, AnalysisError, label_columns, label_varies
from prunelab.analysis.render import (choose_decimals, distinguishing_labels, format_change,
                                      format_mean, none_last, p_text, text_of, to_markdown)
from prunelab.analysis.tables import numeric_first, read_summary_csv

MODEL = LABEL_PREFIX + "model"
# Labels that name the model or its data rather than the setting: never part of the row key.
NOT_SETTING = ("model", "calibration")
# Labels counted in the model's own units: 6 of 18 layers is not 6 of 30, so such rows are joined
# by rank within each model (1st, 2nd... depth) and the cell of the label lists each model's count.
MODEL_RELATIVE = ("layers_removed",)
MISSING = "–"


def metric_family(metric: str) -> str:
    """The metric without its corpus: `ppl/testbed/token` and `ppl/realtext/token` are both
    `ppl/token`, so each model's perplexity on its own text lands in the same row."""
    return re.sub(r"^ppl/[^/]+/", "ppl/", metric)


def side_by_side(summaries: Sequence[pd.DataFrame]) -> pd.DataFrame:
    """Join summaries (one or more models each) into one table of strings: the labels that tell
    settings apart, the metric family, then one column per model, in the order the models first
    appear. Dense rows first; depth settings joined by their rank within each model."""
    summary = pd.concat(list(summaries), ignore_index=True)
    if summary.empty:
        raise AnalysisError("no rows to put side by side")
    summary["family"] = summary["metric"].map(metric_family)
    models = list(dict.fromkeys(summary[MODEL]))
    counts = {}
    for column in label_columns(summary):
        if column.removeprefix(LABEL_PREFIX) in MODEL_RELATIVE:
            summary[column], counts[column] = _ranks(summary, column)
    keys = _key_columns(summary)
    digits = {group: choose_decimals(part["mean"])
              for group, part in summary.groupby([MODEL, "family"])}
    rows: dict[tuple, dict[str, str]] = {}
    for _, row in summary.iterrows():
        values = _key_values(row, keys)
        key = (not row["is_dense"],) + values + (row["family"],)
        cells = rows.setdefault(key, {column.removeprefix(LABEL_PREFIX): value
                                      for column, value in zip(keys, values)}
                                | {"metric": row["family"]})
        model = row[MODEL]
        cells[model] = _cell(row, digits[(model, row["family"])])
    table = pd.DataFrame([rows[key] for key in sorted(rows, key=_row_order)])
    for column, per_level in counts.items():
        name = column.removeprefix(LABEL_PREFIX)
        if name in table:
            table[name] = [_counts_text(per_level[level], models) if level in per_level
                           else level for level in table[name]]
    return table.reindex(columns=[c.removeprefix(LABEL_PREFIX) for c in keys]
                         + ["metric"] + models).fillna("")


def backbone_figure(summaries: Sequence[pd.DataFrame], error: str = "std"):
    """The main metric (perplexity, by its family: each model on its own text) against the first
    ladder label that varies (sparsity, layers removed), one panel per model, a series per
    setting, seed std as error bars."""
    summary = pd.concat(list(summaries), ignore_index=True)
    summary["metric"] = summary["metric"].map(metric_family)
    metric = main_metric(summary)
    settings = summary[(summary["metric"] == metric) & ~summary["is_dense"].astype(bool)]
    ladder = next((column for column in LADDER_LABELS if column in settings
                   and pd.to_numeric(settings[column], errors="coerce").notna().any()), None)
    if ladder is None:
        raise AnalysisError(f"no numeric {' or '.join(LADDER_LABELS)} to draw {metric} against")
    return plot_metric_vs(summary, metric, x=ladder, error=error)


def _ranks(summary: pd.DataFrame, column: str) -> tuple[pd.Series, dict[str, dict[str, str]]]:
    """Each value's rank among its model's values ("1", "2"...), and rank -> {model: value}."""
    ranks = pd.Series("", index=summary.index, dtype=object)
    per_level: dict[str, dict[str, str]] = {}
    for model, part in summary.groupby(MODEL, sort=False):
        values = sorted(part[column].dropna().unique(), key=numeric_first)
        order = {value: str(i + 1) for i, value in enumerate(values)}
        ranks[part.index] = [order.get(value, "") for value in part[column]]
        for value, level in order.items():
            per_level.setdefault(level, {})[model] = text_of(value)
    return ranks, per_level


def _counts_text(per_model: dict[str, str], models: Sequence[str]) -> str:
    return " / ".join(per_model.get(model, MISSING) for model in models)


def _key_columns(summary: pd.DataFrame) -> list[str]:
    """Labels that tell the settings apart; a label implied by the others (the selector of a
    scorer) is dropped; method is kept only when it varies (the dense row names itself)."""
    settings = summary[~summary["is_dense"]]
    keys = [column for column in label_columns(summary)
            if column.removeprefix(LABEL_PREFIX) not in NOT_SETTING
            and label_varies(settings[column])]
    return distinguishing_labels(settings, none_last(settings, keys), within=[MODEL]) or [
        LABEL_PREFIX + "method"]


def _key_values(row: pd.Series, keys: Sequence[str]) -> tuple[str, ...]:
    if row["is_dense"]:  # "dense" in the first key column
        return ("dense",) + ("",) * (len(keys) - 1)
    return tuple(text_of(row[column]) for column in keys)


def _cell(row: pd.Series, digits: int) -> str:
    parts = [format_mean(row, digits), format_change(row, with_std=False)]
    if row.get("is_baseline"):
        parts.append("baseline")
    elif "p_t" in row and np.isfinite(row.get("p_t", np.nan)):
        parts.append(f"p {p_text(row['p_t'])}")
    return " · ".join(part for part in parts if part)


def _row_order(key: tuple) -> tuple:
    # dense first (key[0] is False for it), then settings, numbers sorted as numbers
    return (key[0],) + tuple(numeric_first(v) for v in key[1:])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m prunelab.analysis.by_model",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("tables", nargs="+", help="table.csv files written by prunelab-aggregate")
    parser.add_argument("--out", required=True, help="markdown file to write")
    parser.add_argument("--figure", help="also draw the main metric per model (backbone_figure) to this PNG")
    args = parser.parse_args(argv)
    try:
        missing = [path for path in args.tables if not Path(path).is_file()]
        if missing:
            raise AnalysisError(f"no such table: {', '.join(missing)}")
        summaries = []
        for path in args.tables:
            summary = read_summary_csv(path)
            needed = {"setting", "metric", "mean", "is_dense", LABEL_PREFIX + "model"}
            if not needed <= set(summary.columns):
                raise AnalysisError(f"{path} is not a table.csv written by prunelab-aggregate "
                                    f"(no {', '.join(sorted(needed - set(summary.columns)))})")
            summaries.append(summary)
        table = side_by_side(summaries)
        figure = backbone_figure(summaries) if args.figure else None
    except (AnalysisError, ValueError) as error:
        print(f"by_model: error: {error}", file=sys.stderr)
        return 2
    note = ("Each cell: mean ± std (seeds) · change over the model's own dense value · paired p "
            "against the study's baseline (t-test over seeds). Models are evaluated on their own "
            "text, so compare directions and relative changes across columns, not absolute "
            "perplexities. Layers removed are each model's own, joined by rank (the lighter "
            "removal with the lighter): \"4 / 6\" is 4 layers of the first model column and 6 of "
            f"the second. Built from {', '.join(args.tables)}.")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(to_markdown(table, [note]))
    print(f"wrote {args.out}")
    if figure is not None:
        print(f"wrote {save_figure(figure, args.figure)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
