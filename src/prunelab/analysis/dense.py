"""The dense reference of every setting: paired by model identity and protocol, never by label.

Each record carries the dense model's metrics measured under the run's protocol and the model's
identity key (`model.key`: a digest of its weights' content, see models/identity.py). The dense
rows of a table are one per (model identity, metric, dense protocol stamp); a setting's relative
change is computed against the dense row of its own records' identity and stamp. Two models that
share a label (say a retrained checkpoint under the preset's name) thus get separate dense rows,
and a setting whose records mix dense references gets none (its note says why).
Records older than the identity key fall back to the model label.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Sequence

import pandas as pd

from prunelab.analysis.records import LABEL_PREFIX

log = logging.getLogger(__name__)

DENSE_METHOD = "dense"
MODEL = LABEL_PREFIX + "model"


def reference_of(frame: pd.DataFrame) -> pd.Series:
    """Per frame row, what identifies its dense model: the identity key, else the model label."""
    labels = frame[MODEL].astype(str) if MODEL in frame else pd.Series("", index=frame.index)
    keys = frame["model_key"] if "model_key" in frame else pd.Series(None, index=frame.index)
    return keys.where(keys.notna() & (keys.astype(str) != ""), "label:" + labels).astype(str)


def dense_reference(frame: pd.DataFrame, metrics: Sequence[str]) -> pd.DataFrame:
    """One row per (model identity, metric, dense stamp) with the dense value of `metrics.dense`.

    A metric missing from `metrics.dense` gets no row: speed-ups and costs (`speedup/*`,
    `cost/*`) are ratios to the dense model, 1.0 by definition, and no dense value is invented.
    """
    data = frame[frame["metric"].isin(metrics)].dropna(subset=["dense_value"]).copy()
    if data.empty:
        return pd.DataFrame()
    data["_reference"] = reference_of(data)
    rows = []
    for (reference, metric, stamp), group in data.groupby(["_reference", "metric", "dense_stamp"],
                                                            sort=False):
        values = group["dense_value"].astype(float)
        note = ""
        if values.nunique() > 1:
            note = "dense value differs between records of one model and protocol; first shown"
            log.warning("%s %s: %s", reference, metric, note)
        label = _joined(group[MODEL]) if MODEL in group else ""
        row = {"setting": f"{DENSE_METHOD}:{label}" if label else DENSE_METHOD,
               LABEL_PREFIX + "method": DENSE_METHOD, "metric": metric,
               "higher_is_better": _first(group["higher_is_better"]), "n": 1, "seeds": "",
               "mean": float(values.iloc[0]), "median": float(values.iloc[0]),
               "std": math.nan, "ci_low": math.nan,
               "ci_high": math.nan, "stamp": stamp, "signatures": "", "is_dense": True,
               "note": note, "_reference": reference}
        if MODEL in group:
            row[MODEL] = label
        rows.append(row)
    dense = pd.DataFrame(rows)
    clash = dense.duplicated(["setting", "metric"], keep=False)
    if clash.any():  # one label, several models or protocols: say which row is which
        dense.loc[clash, "setting"] = [f"{s}@{r.removeprefix('label:')[:8]}#{i}" for i, (s, r) in
                                       enumerate(zip(dense.loc[clash, "setting"],
                                                     dense.loc[clash, "_reference"]))]
    return dense


def add_change_over_dense(summary: pd.DataFrame, frame: pd.DataFrame) -> pd.DataFrame:
    """Columns dense_mean, vs_dense = mean / dense - 1 and vs_dense_std = std / dense, each setting
    against the dense row of its records' model identity and dense stamp (`frame` is the flat
    record frame the summary was built from)."""
    summary = summary.copy()
    data = frame.copy()
    data["_reference"] = reference_of(data)
    dense = summary[summary["is_dense"]]
    by_key = {(r, m, s): v for r, m, s, v in
              zip(dense["_reference"], dense["metric"], dense["stamp"], dense["mean"])}
    means = []
    for _, row in summary.iterrows():
        if row["is_dense"]:
            means.append(row["mean"])
            continue
        own = data[data["signature"].isin(str(row["signatures"]).split(","))
                   & (data["metric"] == row["metric"])].dropna(subset=["dense_value"])
        keys = set(zip(own["_reference"], own["metric"], own["dense_stamp"]))
        if len(keys) > 1:
            _add_note(summary, row.name, "records mix dense references (model or protocol)")
        means.append(by_key.get(next(iter(keys)), math.nan) if len(keys) == 1 else math.nan)
    summary["dense_mean"] = means
    summary["vs_dense"] = summary["mean"] / summary["dense_mean"] - 1.0
    summary["vs_dense_std"] = summary["std"] / summary["dense_mean"]
    return summary.drop(columns=["_reference"])


def _joined(values: pd.Series) -> str:
    return "/".join(sorted({str(v) for v in values.dropna()}))


def _first(values: pd.Series) -> Any:
    values = values.dropna()
    return values.iloc[0] if len(values) else None


def _add_note(summary: pd.DataFrame, index: Any, note: str) -> None:
    current = summary.at[index, "note"]
    summary.at[index, "note"] = f"{current}; {note}" if current else note
