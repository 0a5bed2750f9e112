"""Tests of every setting against a named baseline, paired by seed, Holm-adjusted.

Why a module of its own: which row is a setting's baseline (same model, sparsity, depth...) is
the delicate part of a fair comparison; the refusals (different protocol, no shared seed,
ambiguous baseline) are written into the row's note instead of silently comparing.
"""

from __future__ import annotations

import math
import re
from typing import Any, Mapping, Sequence

import pandas as pd

from prunelab.analysis import stats
from prunelab.analysis.records import LABEL_PREFIX, AnalysisError, select_label_columns
from prunelab.analysis.render import is_missing

#: Label keys a setting must share with its baseline (those present in the data are used).
DEFAULT_MATCH_ON = ("model", "sparsity", "sparsity_type", "layers_removed")
SIGNATURE_PATTERN = re.compile(r"^[0-9a-f]{16}$")
COMPARISON_COLUMNS = ("n_pairs", "baseline_mean", "diff_mean", "diff_ci_low", "diff_ci_high",
                      "t_statistic", "p_t", "w_statistic", "p_wilcoxon", "p_t_holm",
                      "p_wilcoxon_holm")


def parse_baseline(selector: str) -> dict[str, str] | str:
    """A baseline selector: a 16-hex signature (returned as str) or `key=value[,key=value]` label
    filters (returned as a dict)."""
    selector = selector.strip()
    if SIGNATURE_PATTERN.match(selector):
        return selector
    filters = {}
    for part in filter(None, (p.strip() for p in selector.split(","))):
        if "=" not in part:
            raise AnalysisError(
                f"bad baseline {selector!r}: use a signature or label filters like "
                "allocation=uniform,method=wanda")
        key, value = (s.strip() for s in part.split("=", 1))
        filters[key] = value
    if not filters:
        raise AnalysisError("empty baseline selector")
    return filters


def resolve_baseline(summary: pd.DataFrame, selector: str) -> tuple[pd.Series, list[str]]:
    """Which non-dense summary rows are baseline rows, and the label columns the selector fixes.

    Raises AnalysisError for an unknown label or a selector that matches nothing.
    """
    parsed = parse_baseline(selector)
    if isinstance(parsed, str):
        mask = summary["signatures"].str.split(",").apply(lambda sigs: parsed in sigs)
        if not mask.any():
            raise AnalysisError(f"unknown baseline {selector!r}: no setting has that signature")
        return mask, []
    try:
        columns = select_label_columns(list(parsed), summary)
    except AnalysisError as error:
        raise AnalysisError(f"unknown baseline {selector!r}: {error}") from None
    mask = pd.Series(True, index=summary.index)
    for column, wanted in zip(columns, parsed.values()):
        mask &= summary[column].apply(lambda value, wanted=wanted: _label_equals(value, wanted))
    mask &= ~summary["is_dense"]
    if not mask.any():
        seen = {column: sorted(map(str, summary[column].dropna().unique())) for column in columns}
        raise AnalysisError(
            f"unknown baseline {selector!r}: no setting matches (values seen: "
            + "; ".join(f"{c.removeprefix(LABEL_PREFIX)}: {', '.join(v)}" for c, v in seen.items())
            + ")")
    return mask, columns


def add_baseline_comparisons(summary: pd.DataFrame, frame: pd.DataFrame, selector: str,
                             match_on: Sequence[str] | None = None,
                             confidence_level: float = 0.95,
                             n_resamples: int = stats.DEFAULT_N_RESAMPLES,
                             seed: int = stats.DEFAULT_SEED) -> pd.DataFrame:
    """Compare every setting with its baseline, paired by seed, and Holm-adjust the p-values.

    A setting's baseline is the baseline row of the same metric that agrees with it on the
    `match_on` labels (default: model, sparsity, sparsity_type, layers_removed, where present;
    labels the selector fixes are not matched; for a signature selector, only the model).
    Refusals (different protocol, no shared seed, missing or ambiguous baseline) leave NaN
    numbers and say why in `note`. The Holm family is every comparison in the table (all
    settings and metrics), separately for the t-test and the Wilcoxon p-values.
    """
    summary = summary.copy()
    is_baseline, fixed = resolve_baseline(summary, selector)
    if match_on is None:
        # One named run-setting is the baseline for every setting of its model.
        by_signature = isinstance(parse_baseline(selector), str)
        match_on = ("model",) if by_signature else DEFAULT_MATCH_ON
    match_columns = [LABEL_PREFIX + key if not key.startswith(LABEL_PREFIX) else key
                     for key in match_on]
    match_columns = [c for c in match_columns if c in summary.columns and c not in fixed]
    summary["is_baseline"] = is_baseline
    for column in COMPARISON_COLUMNS:
        summary[column] = math.nan
    summary["baseline"] = ""
    per_seed = _values_by_setting_and_metric(summary, frame)
    for index, row in summary.iterrows():
        if row["is_baseline"]:
            continue
        candidates = summary[is_baseline & (summary["metric"] == row["metric"])]
        for column in match_columns:
            candidates = candidates[candidates[column].apply(
                lambda value, wanted=row[column]: _same_label(value, wanted))]
        if len(candidates) != 1:
            what = "no" if candidates.empty else f"{len(candidates)} matching (ambiguous)"
            keys = ", ".join(c.removeprefix(LABEL_PREFIX) for c in match_columns) or "any label"
            _add_note(summary, index, f"{what} baseline with the same {keys}")
            continue
        base = candidates.iloc[0]
        summary.at[index, "baseline"] = base["setting"]
        if row["note"] or base["note"]:
            _add_note(summary, index, "not compared (see setting notes)")
            continue
        try:
            comparison = stats.compare_across_seeds(
                per_seed[(row["setting"], row["metric"])],
                per_seed[(base["setting"], base["metric"])],
                _protocol(frame, row), _protocol(frame, base), what=row["metric"],
                confidence_level=confidence_level, n_resamples=n_resamples, seed=seed)
        except stats.PairingError as error:
            _add_note(summary, index, str(error))
            continue
        summary.loc[index, ["n_pairs", "baseline_mean", "diff_mean", "diff_ci_low", "diff_ci_high",
                            "t_statistic", "p_t", "w_statistic", "p_wilcoxon"]] = [
            comparison.n, comparison.mean_baseline, comparison.mean_difference,
            comparison.ci_low, comparison.ci_high, comparison.t_statistic, comparison.p_t,
            comparison.w_statistic, comparison.p_wilcoxon]
        if comparison.n < max(row["n"], base["n"]):
            _add_note(summary, index, f"paired on the {comparison.n} shared seeds "
                                      f"({row['n']} vs {base['n']} runs)")
        for note in comparison.notes:
            _add_note(summary, index, note)
    summary["p_t_holm"] = stats.holm(summary["p_t"].to_numpy(dtype=float))
    summary["p_wilcoxon_holm"] = stats.holm(summary["p_wilcoxon"].to_numpy(dtype=float))
    return summary


def _values_by_setting_and_metric(summary: pd.DataFrame,
                                  frame: pd.DataFrame) -> dict[tuple[str, str], dict[int, float]]:
    names = {signatures: name for name, signatures in
             summary[["setting", "signatures"]].drop_duplicates().itertuples(index=False)}
    by_signature = {signature: name for signatures, name in names.items()
                    for signature in signatures.split(",")}
    values: dict[tuple[str, str], dict[int, float]] = {}
    for row in frame[["signature", "metric", "seed", "value"]].itertuples(index=False):
        setting = by_signature.get(row.signature)
        if setting is not None:
            values.setdefault((setting, row.metric), {})[int(row.seed)] = float(row.value)
    return values


def _protocol(frame: pd.DataFrame, row: pd.Series) -> Mapping[str, Any] | None:
    signatures = row["signatures"].split(",")
    match = frame[frame["signature"].isin(signatures) & (frame["metric"] == row["metric"])]
    return match["protocol"].iloc[0] if len(match) else None


def _label_equals(value: Any, wanted: str) -> bool:
    """A selector's value against a setting's label; `none` also selects a setting without the
    label (`refine=none`: Wanda itself, not Wanda refined by DSnoT)."""
    if is_missing(value):
        return wanted.lower() in ("none", "null")
    if str(value) == wanted:
        return True
    try:
        return math.isclose(float(value), float(wanted))
    except (TypeError, ValueError):
        return False
def _same_label(a: Any, b: Any) -> bool:
    if is_missing(a) or is_missing(b):
        return is_missing(a) and is_missing(b)
    return a == b or str(a) == str(b)
def _add_note(summary: pd.DataFrame, index: Any, note: str) -> None:
    current = summary.at[index, "note"]
    summary.at[index, "note"] = f"{current}; {note}" if current else note
