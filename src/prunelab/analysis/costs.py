"""Cost tables: what each setting cost to prune and what its pruned model costs to run, medians
over seeds, from the records' `pruning_cost` and `efficiency` sections (docs/result_record.md).

Three claims read from them: WRP scores layers without a forward pass where block influence needs
one and SLEB one per candidate (`forward_passes` of the first stage); PALS adds little to the
allocation (`allocate_s`); a recovery operator gives back part of what removing layers saved
(`recovery_share_of_saving`: with s the measured prefill speedup of the recovered model and s0
that of the same removal without recovery, (1/s - 1/s0) / (1 - 1/s0), the fraction of the time
saved by removal that the operators spend again; `recovery_share_of_saved_flops`, the same from the
counted FLOPs, (f - f0) / (1 - f0) with f the FLOPs as a fraction of dense, exact where the timing
is noise-bound). PyTorch's FLOP counter counts matrix products: a diagonal operator (LinearPatch-D)
or one merged into a layer (ReplaceMe) adds none.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from prunelab.analysis.records import COMPLETED, LABEL_PREFIX, RunRecord, label_varies
from prunelab.analysis.render import to_latex, to_markdown

#: The labels that name a setting in a cost table, in order.
SETTING_LABELS = ("model", "method", "refine", "permutation", "layers_removed", "params_removed", "scorer",
                  "sparsity", "sparsity_type", "allocation", "recovery")
FIRST_STAGES = ("allocate", "score")


def cost_frame(records: Iterable[RunRecord]) -> pd.DataFrame:
    """One row per completed record: its labels, each pruning stage's seconds and passes over the
    calibration data, and, when measured, the speedups and cost ratios of its pruned model."""
    rows = []
    for record in records:
        cost = record.data.get("pruning_cost")
        if record.status != COMPLETED or not cost:
            continue
        stages = cost["stages"]
        first = next((s for s in FIRST_STAGES if s in stages), None)
        row = {**{LABEL_PREFIX + k: v for k, v in record.labels.items()}, "seed": record.seed,
               "first_stage": first,
               "first_stage_s": stages[first]["seconds"] if first else np.nan,
               "first_stage_forward_passes": stages[first]["forward_passes"] if first else np.nan,
               "first_stage_backward_passes": stages[first]["backward_passes"] if first else np.nan,
               "prune_s": stages.get("prune", {}).get("seconds", np.nan),
               "recover_s": stages.get("recover", {}).get("seconds", np.nan),
               "forward_passes": cost["total"]["forward_passes"],
               "backward_passes": cost["total"]["backward_passes"]}
        efficiency = record.data.get("efficiency") or {}
        if efficiency.get("measured"):
            ratio = efficiency["counted"]["ratio"]
            row.update({"speedup_prefill": efficiency["speedup"]["prefill"],
                        "speedup_decode": efficiency["speedup"]["decode"],
                        "flops_ratio": ratio["flops_prefill"], "params_ratio": ratio["parameters"],
                        "kv_ratio": ratio["kv_bytes_per_token"]})
        rows.append(row)
    return pd.DataFrame(rows)


def cost_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Medians over seeds per setting (labels that vary, in SETTING_LABELS order), with `n`, and
    the speedups' spread over seeds as min-max; recovered settings get recovery_share_of_saving."""
    if frame.empty:
        return frame
    labels = [LABEL_PREFIX + k for k in SETTING_LABELS if LABEL_PREFIX + k in frame
              and label_varies(frame[LABEL_PREFIX + k])]
    labels = labels or [LABEL_PREFIX + "method"]
    values = [c for c in frame.columns if c not in labels and c not in ("seed", "first_stage")
              and not c.startswith(LABEL_PREFIX)]
    grouped = frame.groupby(labels, dropna=False, sort=True)
    table = grouped[values].median(numeric_only=True)
    table.insert(0, "n", grouped.size())
    table.insert(1, "first_stage", grouped["first_stage"].first())
    for column in ("speedup_prefill", "speedup_decode"):
        if column in frame:
            table[f"{column}_range"] = grouped[column].agg(
                lambda s: f"{s.min():.2f}-{s.max():.2f}" if s.notna().any() else "")
    table = table.reset_index()
    if LABEL_PREFIX + "recovery" in table and "speedup_prefill" in table:
        table["recovery_share_of_saving"] = recovery_share(table, lambda s: 1 / s, "speedup_prefill")
        table["recovery_share_of_saved_flops"] = recovery_share(table, lambda f: f, "flops_ratio")
    return table


def recovery_share(table: pd.DataFrame, cost: Callable[[float], float], column: str) -> pd.Series:
    """(c - c0) / (1 - c0) per recovered row, c = cost(row[column]) as a fraction of dense's (1/s
    for a speedup s, f for a FLOP ratio), c0 that of the row without recovery that shares the
    other labels; NaN where there is no such row or nothing was saved."""
    recovery = LABEL_PREFIX + "recovery"
    others = [c for c in table.columns if c.startswith(LABEL_PREFIX) and c != recovery]
    plain = table[table[recovery] == "none"].set_index(others)[column] if others else \
        table.loc[table[recovery] == "none", column]

    def share(row: pd.Series) -> float:
        if row[recovery] == "none":
            return np.nan
        key = tuple(row[c] for c in others) if len(others) > 1 else (row[others[0]] if others else None)
        try:
            c0 = cost(float(plain.loc[key]) if others else float(plain.iloc[0]))
        except (KeyError, IndexError):
            return np.nan
        return (cost(row[column]) - c0) / (1 - c0) if c0 < 1 else np.nan

    return table.apply(share, axis=1)


def _cell(value) -> str:
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return ""
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def write_cost_tables(records: Sequence[RunRecord], out: str | Path, formats: Sequence[str] = ("md", "csv")) -> list[Path]:
    """cost_table.md/.csv (and .tex) in `out`; nothing when no record has a pruning_cost."""
    table = cost_table(cost_frame(records))
    if table.empty:
        return []
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    shown = table.rename(columns=lambda c: c.removeprefix(LABEL_PREFIX)).astype(object).map(_cell)
    written = []
    for fmt in formats:
        path = out / f"cost_table.{fmt}"
        if fmt == "csv":
            table.to_csv(path, index=False)
        else:
            path.write_text(to_markdown(shown) if fmt == "md" else to_latex(shown), encoding="utf-8")
        written.append(path)
    return written
