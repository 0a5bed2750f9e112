"""Item-level tests between two single runs: paired bootstrap over perplexity windows, McNemar
over zero-shot items. For when there are no seeds to pair (one expensive run per method).
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import pandas as pd

from prunelab.analysis import stats
from prunelab.analysis.records import AnalysisError, RunRecord
from prunelab.analysis.tables import select_metrics


def compare_runs(record_a: RunRecord, record_b: RunRecord, metrics: Sequence[str] | None = None,
                 confidence_level: float = 0.95,
                 n_resamples: int = stats.DEFAULT_N_RESAMPLES,
                 seed: int = stats.DEFAULT_SEED) -> pd.DataFrame:
    """Item-level tests between two runs, one row per shared metric (difference = a - b).

    Perplexity metrics: paired bootstrap over windows/documents. Per-item 0/1 metrics
    (zero-shot accuracy): McNemar, exact binomial p (`p`) and continuity-corrected chi-square
    (`p_chi2`). Metrics with different protocol stamps or no samples get a note instead.
    """
    metrics_a, metrics_b = record_a.metrics(), record_b.metrics()
    shared = [key for key in metrics_a if key in metrics_b]
    if metrics:
        frame = pd.DataFrame({"metric": shared})
        shared = select_metrics(frame, metrics)
    rows = []
    for key in shared:
        a, b = metrics_a[key], metrics_b[key]
        row: dict[str, Any] = {"metric": key, "value_a": a.get("value"), "value_b": b.get("value")}
        try:
            stats.check_same_protocol(a.get("protocol"), b.get("protocol"), key)
            row.update(_item_test(key, a, b, confidence_level, n_resamples, seed))
        except AnalysisError as error:
            row["note"] = str(error)
        rows.append(row)
    columns = ["metric", "test", "value_a", "value_b", "difference", "ci_low", "ci_high", "p",
               "p_chi2", "n_units", "a_only", "b_only", "note"]
    return pd.DataFrame(rows).reindex(columns=columns)


def _item_test(key: str, a: Mapping[str, Any], b: Mapping[str, Any], confidence_level: float,
               n_resamples: int, seed: int) -> dict[str, Any]:
    samples_a, samples_b = a.get("samples") or {}, b.get("samples") or {}
    evaluator = (a.get("protocol") or {}).get("evaluator", "")
    if evaluator == "perplexity" or key.startswith("ppl/"):
        result = stats.paired_bootstrap_perplexity(samples_a, samples_b, confidence_level,
                                                   n_resamples, seed)
        note = (_consistency_note(a, result.perplexity_a)
                or _consistency_note(b, result.perplexity_b))
        return {"test": f"paired bootstrap over {samples_a.get('unit', 'window')}s",
                "value_a": result.perplexity_a, "value_b": result.perplexity_b,
                "difference": result.difference, "ci_low": result.ci_low,
                "ci_high": result.ci_high, "p": result.pvalue, "n_units": result.n_units,
                "note": note}
    if "values" not in samples_a or "values" not in samples_b:
        raise AnalysisError("no per-item samples for this metric")
    result = stats.mcnemar(samples_a["values"], samples_b["values"])
    return {"test": "McNemar (exact binomial)", "value_a": result.accuracy_a,
            "value_b": result.accuracy_b, "difference": result.difference, "p": result.p_exact,
            "p_chi2": result.p_chi2, "n_units": result.n_items, "a_only": result.a_only,
            "b_only": result.b_only, "note": ""}


def _consistency_note(metric: Mapping[str, Any], recomputed: float) -> str:
    value = metric.get("value")
    if value is None or math.isclose(float(value), recomputed, rel_tol=1e-4):
        return ""
    return f"recorded value {value} differs from samples' perplexity {recomputed:.6g}"
