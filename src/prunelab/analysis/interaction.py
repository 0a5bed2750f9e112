"""Does an effect depend on the model? The interaction test behind a cross-backbone claim.

"PALS helps LLaMA-2 but not Mistral" is a claim about the size of a paired effect on each model,
and three separate p-values do not test it (one significant and one not says nothing about
their difference). Here every setting's per-seed difference from its baseline is taken within
each model (paired by seed, on the same match labels, e.g. sparsity), and the question is whether
its mean differs across models: a one-way ANOVA of the differences on the model, the F-test of
`C(model)` in an ordinary least-squares fit (statsmodels), Holm-adjusted across the table.

Perplexity differences are on the log scale (log ppl(setting) - log ppl(baseline), the log of
their ratio), because the models' perplexities differ by orders of magnitude; accuracies are plain
differences. Each model's mean difference comes with its t-interval over seeds.

    prunelab-aggregate results/pals/records --baseline allocation=uniform --interaction model ...
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from prunelab.analysis import stats
from prunelab.analysis.baseline import DEFAULT_MATCH_ON, parse_baseline
from prunelab.analysis.records import LABEL_PREFIX, AnalysisError, select_label_columns
from prunelab.analysis.render import to_markdown

LOG_SCALE_PREFIXES = ("ppl/",)


def scale_of(metric: str) -> str:
    return "log ratio" if metric.startswith(LOG_SCALE_PREFIXES) else "difference"


def paired_differences(frame: pd.DataFrame, metrics: Sequence[str], baseline: str, across: str = "model",
                       match_on: Sequence[str] | None = None) -> pd.DataFrame:
    """One row per (metric, treatment, match labels, model, seed): the seed's value minus the
    baseline's on the same model, seed and match labels (log ratio for perplexities)."""
    parsed = parse_baseline(baseline)
    if isinstance(parsed, str):
        raise AnalysisError("--interaction needs a baseline given by labels (allocation=uniform), not a signature")
    fixed = select_label_columns(list(parsed), frame)
    across_column = select_label_columns([across], frame)[0]
    match = [LABEL_PREFIX + k.removeprefix(LABEL_PREFIX) for k in (match_on or DEFAULT_MATCH_ON)]
    match = [c for c in match if c in frame.columns and c not in fixed and c != across_column]
    data = frame[frame["metric"].isin(metrics) & frame["value"].notna()]
    is_baseline = pd.Series(np.logical_and.reduce([data[c].astype(str) == str(v)
                                                   for c, v in zip(fixed, parsed.values())]), index=data.index)
    rows = []
    keys = ["metric", across_column, *match]
    for key, group in data.groupby(keys, dropna=False, sort=True):
        key = dict(zip(keys, key if isinstance(key, tuple) else (key,)))
        base = group[is_baseline[group.index]].set_index("seed")["value"]
        treated = group[~is_baseline[group.index]]
        log_scale = scale_of(key["metric"]) == "log ratio"
        for treatment, runs in treated.groupby(fixed, dropna=False, sort=True):
            treatment = treatment if isinstance(treatment, tuple) else (treatment,)
            for seed, value in runs.set_index("seed")["value"].items():
                if seed not in base.index:
                    continue
                diff = math.log(value) - math.log(base[seed]) if log_scale else value - base[seed]
                rows.append({**key, **dict(zip(fixed, treatment)), "seed": seed, "diff": diff})
    if not rows:
        raise AnalysisError(f"no setting shares a seed with the baseline {baseline!r} on any {across}")
    return pd.DataFrame(rows)


def interaction_table(frame: pd.DataFrame, metrics: Sequence[str], baseline: str, across: str = "model",
                      match_on: Sequence[str] | None = None) -> pd.DataFrame:
    """One row per (metric, treatment, match labels): each model's mean paired difference with its
    95% t-interval and seed count, and the F-test of whether the mean differs across models."""
    from statsmodels.formula.api import ols
    from statsmodels.stats.anova import anova_lm

    diffs = paired_differences(frame, metrics, baseline, across, match_on)
    across_column = LABEL_PREFIX + across.removeprefix(LABEL_PREFIX)
    setting = [c for c in diffs.columns if c not in ("metric", across_column, "seed", "diff")]
    rows = []
    for key, group in diffs.groupby(["metric", *setting], dropna=False, sort=True):
        row = {"metric": key[0], "scale": scale_of(key[0]), **dict(zip(setting, key[1:]))}
        for model, runs in group.groupby(across_column, sort=True):
            values = runs["diff"].to_numpy(float)
            low, high = stats.mean_confidence_interval(values)
            row[f"{model}"] = (float(values.mean()), low, high, len(values))
        usable = group.groupby(across_column).filter(lambda g: len(g) >= 2)
        row["F"], row["p_interaction"], row["note"] = math.nan, math.nan, ""
        if usable[across_column].nunique() >= 2 and len(usable) > usable[across_column].nunique():
            fit = ols("diff ~ C(model)", data=usable.rename(columns={across_column: "model"})).fit()
            test = anova_lm(fit, typ=2).loc["C(model)"]
            row["F"], row["p_interaction"] = float(test["F"]), float(test["PR(>F)"])
        else:
            row["note"] = f"fewer than two {across}s with two or more paired seeds: no test"
        rows.append(row)
    table = pd.DataFrame(rows)
    # every model's column before the test's, whichever row first had it (one lacking a setting)
    models = sorted(diffs[across_column].astype(str).unique())
    table = table.reindex(columns=["metric", "scale", *setting, *[m for m in models if m in table],
                                   "F", "p_interaction", "note"])
    tested = table["p_interaction"].notna()
    table["p_holm"] = math.nan
    if tested.any():
        table.loc[tested, "p_holm"] = stats.holm(table.loc[tested, "p_interaction"].to_numpy())
    return table


def models_of(table: pd.DataFrame) -> list[str]:
    return [c for c in table.columns if table[c].map(lambda v: isinstance(v, tuple)).any()]


def format_interaction(table: pd.DataFrame) -> pd.DataFrame:
    """The human table: a cell per model `mean [low, high] (n)`, then F and the p-values."""
    def cell(value):
        if not isinstance(value, tuple):
            return "–"
        mean, low, high, n = value
        interval = f" [{low:+.3f}, {high:+.3f}]" if n > 1 else ""
        return f"{mean:+.3f}{interval} ({n})"

    shown = table.copy()
    for model in models_of(table):
        shown[model] = shown[model].map(cell)
    shown["F"] = shown["F"].map(lambda v: "" if pd.isna(v) else f"{v:.2f}")
    for column in ("p_interaction", "p_holm"):
        shown[column] = shown[column].map(lambda v: "" if pd.isna(v) else ("<0.001" if v < 0.001 else f"{v:.3f}"))
    shown.columns = [c.removeprefix(LABEL_PREFIX) for c in shown.columns]
    return shown


def write_interaction(table: pd.DataFrame, out: Path, across: str, baseline: str,
                      plots: bool = True) -> list[Path]:
    """interaction.csv (numbers, one column set per model) and interaction.md, and a figure per
    metric: each model's mean difference with its interval, one group per treatment."""
    out.mkdir(parents=True, exist_ok=True)
    flat = table.copy()
    for model in models_of(table):
        parts = flat.pop(model)
        for i, name in enumerate(("diff_mean", "diff_ci_low", "diff_ci_high", "n")):
            flat[f"{name}[{model}]"] = parts.map(lambda v, i=i: v[i] if isinstance(v, tuple) else math.nan)
    csv = out / "interaction.csv"
    flat.to_csv(csv, index=False)
    notes = [f"Each {across} cell: the mean over seeds of setting minus baseline ({baseline}), paired by seed "
             "within the model, with its 95% t-interval and the number of seeds; perplexity as the log of "
             "the ratio (negative: lower perplexity than the baseline), accuracy as a difference. F and "
             f"p_interaction: one-way ANOVA of the paired differences on the {across} (does the effect "
             "depend on it?); p_holm: Holm over the table's rows."]
    md = out / "interaction.md"
    md.write_text(to_markdown(format_interaction(table), notes) + "\n")
    return [csv, md, *(_plot(table, out, baseline) if plots else [])]


def _plot(table: pd.DataFrame, out: Path, baseline: str) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    models = models_of(table)
    setting = [c for c in table.columns if c.startswith(LABEL_PREFIX)]
    for metric, rows in table.groupby("metric", sort=True):
        fig, ax = plt.subplots(figsize=(max(4.0, 0.9 * len(rows) * max(len(models), 1)), 3.2))
        width = 0.8 / max(len(models), 1)
        for m, model in enumerate(models):
            cells = rows[model].tolist()
            xs = [i + (m - (len(models) - 1) / 2) * width for i in range(len(rows))]
            means = [c[0] if isinstance(c, tuple) else math.nan for c in cells]
            errors = [[c[0] - c[1] if isinstance(c, tuple) and c[3] > 1 else 0 for c in cells],
                      [c[2] - c[0] if isinstance(c, tuple) and c[3] > 1 else 0 for c in cells]]
            ax.errorbar(xs, means, yerr=errors, fmt="o", capsize=3, label=str(model))
        ax.axhline(0, color="grey", lw=0.8)
        ax.set_xticks(range(len(rows)))
        ax.set_xticklabels([" ".join(str(r[c]) for c in setting) for _, r in rows.iterrows()], fontsize=8)
        ax.set_ylabel(f"{scale_of(metric)} vs {baseline}")
        ax.set_title(f"{metric}: p_interaction per setting in interaction.md", fontsize=9)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = out / f"interaction_{metric.replace('/', '-').replace('*', 'all')}.png"
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)
    return written
