"""Paired statistics for comparing pruning settings: across seeds and between two single runs.

Why paired: two settings run with the same seed share the calibration sample, so their difference
is far less noisy than their separate spreads suggest. Every test here therefore works on pairs
matched by seed (across runs) or by evaluation window / item (within one pair of runs), and refuses
to pair numbers measured under different protocols (a perplexity at seqlen 2048 is not comparable
with one at 4096).

All functions are pure: numbers in, small result objects out. scipy and statsmodels do the
statistics (t-test, Wilcoxon, bootstrap and t-interval from scipy; Holm's adjustment and McNemar's
test from statsmodels); the only arithmetic written here is the bootstrap p-value read off scipy's
bootstrap distribution.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np
from scipy import stats
from statsmodels.stats import contingency_tables
from statsmodels.stats.multitest import multipletests

from prunelab.analysis.records import AnalysisError

#: Below this many non-zero paired differences the two-sided exact Wilcoxon test cannot reach
#: p < 0.05 (its smallest p-value is 2 / 2**n), so a note says so.
WILCOXON_MIN_N_FOR_5PCT = 6

DEFAULT_N_RESAMPLES = 9999
DEFAULT_SEED = 0


class PairingError(AnalysisError):
    """Two settings or runs cannot be paired: different protocols, or no shared seeds/items."""


# --------------------------------------------------------------------------- pairing


def protocol_differences(stamp_a: Mapping[str, Any] | None,
                         stamp_b: Mapping[str, Any] | None) -> list[str]:
    """Return one "field a vs b" string per protocol field whose values differ (empty if equal).

    A missing stamp on both sides counts as equal (rows from W&B may carry none); a stamp on one
    side only is a difference.
    """
    if not stamp_a and not stamp_b:
        return []
    if not stamp_a or not stamp_b:
        return ["protocol stamp present on one side only"]
    differences = []
    for key in sorted(set(stamp_a) | set(stamp_b)):
        value_a, value_b = stamp_a.get(key, "<missing>"), stamp_b.get(key, "<missing>")
        if value_a != value_b:
            differences.append(f"{key} {_short(value_a)} vs {_short(value_b)}")
    return differences


def check_same_protocol(stamp_a: Mapping[str, Any] | None, stamp_b: Mapping[str, Any] | None,
                        what: str = "metric") -> None:
    """Raise PairingError naming the differing stamp fields when the protocols are not equal."""
    differences = protocol_differences(stamp_a, stamp_b)
    if differences:
        raise PairingError(f"refusing to pair {what}: protocol differs ({'; '.join(differences)})")


def pair_by_seed(values_a: Mapping[int, float], values_b: Mapping[int, float],
                 stamp_a: Mapping[str, Any] | None = None,
                 stamp_b: Mapping[str, Any] | None = None,
                 what: str = "metric") -> tuple[list[int], np.ndarray, np.ndarray]:
    """Match two settings' per-seed values on their shared seeds.

    Returns (seeds, a, b) with a[i], b[i] measured with seeds[i]. Raises PairingError when the
    protocol stamps differ or the seed sets do not overlap.
    """
    check_same_protocol(stamp_a, stamp_b, what)
    seeds = sorted(set(values_a) & set(values_b))
    if not seeds:
        raise PairingError(
            f"refusing to pair {what}: no shared seeds "
            f"({_seed_list(values_a)} vs {_seed_list(values_b)})")
    a = np.array([values_a[s] for s in seeds], dtype=float)
    b = np.array([values_b[s] for s in seeds], dtype=float)
    return seeds, a, b


# --------------------------------------------------------------------------- across seeds


@dataclass(frozen=True)
class TestResult:
    """A test statistic, its p-value (NaN when the test is undefined) and why, if it is NaN."""

    statistic: float
    pvalue: float
    note: str = ""


@dataclass(frozen=True)
class Interval:
    """A confidence interval; NaN bounds with a note when it cannot be computed."""

    low: float
    high: float
    note: str = ""


def paired_t_test(a: Sequence[float], b: Sequence[float]) -> TestResult:
    """Paired t-test of mean(a - b) = 0 (scipy.stats.ttest_rel), two-sided.

    NaN with a note for fewer than two pairs or constant differences (t is then +-inf or 0/0,
    which says nothing about seed-to-seed variation).
    """
    a, b = _as_pairs(a, b)
    differences = a - b
    if len(differences) < 2:
        return TestResult(math.nan, math.nan, f"t-test needs >= 2 pairs (n={len(differences)})")
    if _is_constant(differences):
        return TestResult(math.nan, math.nan, "t-test undefined: paired differences are constant")
    result = stats.ttest_rel(a, b)
    return TestResult(float(result.statistic), float(result.pvalue))


def wilcoxon_signed_rank(a: Sequence[float], b: Sequence[float]) -> TestResult:
    """Wilcoxon signed-rank test of the paired differences (scipy.stats.wilcoxon), two-sided.

    scipy's defaults: zero differences are dropped ("wilcox"), exact distribution for small n
    without ties. NaN with a note when fewer than two pairs or all differences are zero; a note
    (but a real p) when n is too small for the test to ever reach p < 0.05.
    """
    a, b = _as_pairs(a, b)
    differences = a - b
    nonzero = int(np.count_nonzero(differences))
    if len(differences) < 2:
        return TestResult(math.nan, math.nan, f"Wilcoxon needs >= 2 pairs (n={len(differences)})")
    if nonzero == 0:
        return TestResult(math.nan, math.nan, "Wilcoxon undefined: all paired differences are zero")
    result = stats.wilcoxon(a, b)
    note = ""
    if nonzero < WILCOXON_MIN_N_FOR_5PCT:
        note = (f"Wilcoxon with n={nonzero} non-zero differences cannot reach p<0.05 "
                f"(smallest p {2 / 2 ** nonzero:.3g})")
    return TestResult(float(result.statistic), float(result.pvalue), note)


def bootstrap_mean_difference(a: Sequence[float], b: Sequence[float],
                              confidence_level: float = 0.95,
                              n_resamples: int = DEFAULT_N_RESAMPLES,
                              seed: int = DEFAULT_SEED,
                              method: str = "percentile") -> Interval:
    """Bootstrap CI of mean(a - b), resampling seeds as pairs (scipy.stats.bootstrap, paired=True).

    Percentile by default: with 3-10 seeds BCa's jackknife acceleration is unstable and is
    undefined when all differences are equal; pass method="BCa" for larger samples (it falls
    back to percentile, with a note, where BCa is undefined).
    """
    a, b = _as_pairs(a, b)
    if len(a) < 2:
        return Interval(math.nan, math.nan, f"bootstrap CI needs >= 2 pairs (n={len(a)})")
    if _is_constant(a - b):
        value = float(np.mean(a - b))
        return Interval(value, value, "bootstrap CI degenerate: paired differences are constant")
    interval = _scipy_bootstrap((a, b), _mean_difference, confidence_level, n_resamples, seed,
                                method).confidence_interval
    note = ""
    if method != "percentile" and not np.isfinite([interval.low, interval.high]).all():
        interval = _scipy_bootstrap((a, b), _mean_difference, confidence_level, n_resamples,
                                    seed, "percentile").confidence_interval
        note = f"{method} undefined here; percentile bootstrap used"
    return Interval(float(interval.low), float(interval.high), note)


def holm(pvalues: Sequence[float]) -> np.ndarray:
    """Holm step-down adjusted p-values (family-wise error), same order as given
    (statsmodels' `multipletests(method="holm")`).

    NaN p-values are left NaN and do not count towards the family size: a comparison that was
    refused (different protocol, too few seeds) is not a test, so it must not inflate the others.
    """
    pvalues = np.asarray(pvalues, dtype=float)
    adjusted = np.full_like(pvalues, np.nan)
    finite = np.isfinite(pvalues)
    if finite.any():
        adjusted[finite] = multipletests(pvalues[finite], method="holm")[1]
    return adjusted


@dataclass(frozen=True)
class SeedComparison:
    """A setting against its baseline over shared seeds; difference is setting - baseline."""

    seeds: list[int]
    mean_setting: float
    mean_baseline: float
    mean_difference: float
    ci_low: float
    ci_high: float
    t_statistic: float
    p_t: float
    w_statistic: float
    p_wilcoxon: float
    notes: list[str] = field(default_factory=list)

    @property
    def n(self) -> int:
        return len(self.seeds)


def compare_across_seeds(values: Mapping[int, float], baseline: Mapping[int, float],
                         stamp: Mapping[str, Any] | None = None,
                         baseline_stamp: Mapping[str, Any] | None = None,
                         what: str = "metric",
                         confidence_level: float = 0.95,
                         n_resamples: int = DEFAULT_N_RESAMPLES,
                         seed: int = DEFAULT_SEED) -> SeedComparison:
    """Pair by seed, then run the t-test, Wilcoxon and the bootstrap CI of the mean difference.

    `values` and `baseline` map seed -> metric value. Raises PairingError (see pair_by_seed).
    """
    seeds, a, b = pair_by_seed(values, baseline, stamp, baseline_stamp, what)
    t_test = paired_t_test(a, b)
    wilcoxon = wilcoxon_signed_rank(a, b)
    interval = bootstrap_mean_difference(a, b, confidence_level, n_resamples, seed)
    notes = [note for note in (t_test.note, wilcoxon.note, interval.note) if note]
    return SeedComparison(
        seeds=seeds, mean_setting=float(a.mean()), mean_baseline=float(b.mean()),
        mean_difference=float((a - b).mean()), ci_low=interval.low, ci_high=interval.high,
        t_statistic=t_test.statistic, p_t=t_test.pvalue,
        w_statistic=wilcoxon.statistic, p_wilcoxon=wilcoxon.pvalue, notes=notes)


def mean_confidence_interval(values: Sequence[float],
                             confidence_level: float = 0.95) -> tuple[float, float]:
    """Student-t interval of the mean over seeds (scipy.stats.t.interval); NaN for n < 2."""
    values = np.asarray(values, dtype=float)
    if len(values) < 2:
        return math.nan, math.nan
    mean = float(values.mean())
    if _is_constant(values):
        return mean, mean
    low, high = stats.t.interval(confidence_level, len(values) - 1, loc=mean,
                                 scale=stats.sem(values))
    # Rounding can put a bound a hair past the mean (seeds that agree to 1e-16): never report
    # a negative half-width.
    return min(float(low), mean), max(float(high), mean)


# --------------------------------------------------------------------------- two single runs


def weighted_perplexity(values: Sequence[float], weights: Sequence[float] | None = None) -> float:
    """Perplexity from per-window mean NLLs: exp(sum(values * weights) / sum(weights))."""
    values = np.asarray(values, dtype=float)
    weights = np.ones_like(values) if weights is None else np.asarray(weights, dtype=float)
    return float(np.exp(np.sum(values * weights) / np.sum(weights)))


@dataclass(frozen=True)
class BootstrapComparison:
    """Paired bootstrap over evaluation windows: perplexity difference a - b, CI, p-value."""

    n_units: int
    perplexity_a: float
    perplexity_b: float
    difference: float
    ci_low: float
    ci_high: float
    pvalue: float
    n_resamples: int


def paired_bootstrap_perplexity(samples_a: Mapping[str, Any], samples_b: Mapping[str, Any],
                                confidence_level: float = 0.95,
                                n_resamples: int = DEFAULT_N_RESAMPLES,
                                seed: int = DEFAULT_SEED) -> BootstrapComparison:
    """Compare two runs' perplexities on the same windows (or documents) by paired bootstrap.

    Window indices are resampled jointly for both runs (scipy.stats.bootstrap, paired=True); each
    resample's perplexity is exp(weighted mean NLL). The CI is the percentile interval of
    ppl_a - ppl_b. The two-sided p-value is read off the same bootstrap distribution, centred on
    the observed difference to mimic the null: p = (1 + #{|d* - d| >= |d|}) / (B + 1)
    (Davison & Hinkley 1997, ch. 4), so identical runs give p = 1.

    `samples_*` are the records' `samples` dicts: {"values": [...], "weights": [...]}.
    """
    values_a, weights_a = _window_arrays(samples_a)
    values_b, weights_b = _window_arrays(samples_b)
    if len(values_a) != len(values_b):
        raise PairingError(f"refusing to pair windows: {len(values_a)} vs {len(values_b)} windows")
    if len(values_a) < 2:
        raise PairingError(f"paired bootstrap needs >= 2 windows (got {len(values_a)})")
    observed = _perplexity_difference(values_a, weights_a, values_b, weights_b, axis=-1)
    result = _scipy_bootstrap((values_a, weights_a, values_b, weights_b), _perplexity_difference,
                              confidence_level, n_resamples, seed, "percentile")
    distribution = result.bootstrap_distribution
    threshold = abs(observed) - _tolerance(observed)
    extreme = np.count_nonzero(np.abs(distribution - observed) >= threshold)
    pvalue = (1 + extreme) / (len(distribution) + 1)
    low, high = result.confidence_interval
    return BootstrapComparison(
        n_units=len(values_a), perplexity_a=weighted_perplexity(values_a, weights_a),
        perplexity_b=weighted_perplexity(values_b, weights_b), difference=float(observed),
        ci_low=float(low), ci_high=float(high), pvalue=float(pvalue), n_resamples=n_resamples)


@dataclass(frozen=True)
class McNemarResult:
    """McNemar's test on per-item correctness of two runs over the same items.

    `a_only` = items a gets right and b wrong, `b_only` the reverse. `p_exact` is the exact
    binomial test of a_only ~ Binomial(a_only + b_only, 1/2) (the reported p); `chi2`/`p_chi2`
    the chi-square version with Edwards' continuity correction, for reference.
    """

    n_items: int
    accuracy_a: float
    accuracy_b: float
    a_only: int
    b_only: int
    p_exact: float
    chi2: float
    p_chi2: float

    @property
    def difference(self) -> float:
        return self.accuracy_a - self.accuracy_b


def mcnemar(correct_a: Sequence[float], correct_b: Sequence[float]) -> McNemarResult:
    """McNemar's test (statsmodels' `contingency_tables.mcnemar`): exact binomial and the
    continuity-corrected chi-square, on the 2x2 table of per-item correctness.

    With no discordant items both p-values are 1 (the runs agree on every item; the chi-square
    would divide by zero).
    """
    a = np.asarray(correct_a, dtype=float)
    b = np.asarray(correct_b, dtype=float)
    if a.shape != b.shape or a.ndim != 1:
        raise PairingError(f"refusing to pair items: {a.shape} vs {b.shape}")
    if not (np.isin(a, (0, 1)).all() and np.isin(b, (0, 1)).all()):
        raise AnalysisError("McNemar needs per-item correctness values of 0 or 1")
    a_only = int(np.count_nonzero((a == 1) & (b == 0)))
    b_only = int(np.count_nonzero((a == 0) & (b == 1)))
    both = int(np.count_nonzero((a == 1) & (b == 1)))
    neither = len(a) - a_only - b_only - both
    if a_only + b_only == 0:
        p_exact, chi2, p_chi2 = 1.0, 0.0, 1.0
    else:
        table = [[both, a_only], [b_only, neither]]
        p_exact = float(contingency_tables.mcnemar(table, exact=True).pvalue)
        corrected = contingency_tables.mcnemar(table, exact=False, correction=True)
        chi2, p_chi2 = float(corrected.statistic), float(corrected.pvalue)
    return McNemarResult(n_items=len(a), accuracy_a=float(a.mean()), accuracy_b=float(b.mean()),
                         a_only=a_only, b_only=b_only, p_exact=p_exact, chi2=chi2,
                         p_chi2=p_chi2)


# --------------------------------------------------------------------------- helpers


def _mean_difference(a, b, axis=-1):
    return np.mean(a - b, axis=axis)


def _perplexity_difference(values_a, weights_a, values_b, weights_b, axis=-1):
    ppl_a = np.exp(np.sum(values_a * weights_a, axis=axis) / np.sum(weights_a, axis=axis))
    ppl_b = np.exp(np.sum(values_b * weights_b, axis=axis) / np.sum(weights_b, axis=axis))
    return ppl_a - ppl_b


def _scipy_bootstrap(data, statistic, confidence_level, n_resamples, seed, method):
    return stats.bootstrap(data, statistic, paired=True, vectorized=True, axis=-1,
                           n_resamples=n_resamples, confidence_level=confidence_level,
                           method=method, batch=1000, rng=np.random.default_rng(seed))


def _window_arrays(samples: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    if not samples or "values" not in samples:
        raise AnalysisError("run has no per-window samples for this metric")
    values = np.asarray(samples["values"], dtype=float)
    weights = samples.get("weights")
    weights = np.ones_like(values) if weights is None else np.asarray(weights, dtype=float)
    if weights.shape != values.shape:
        raise AnalysisError(f"samples: {len(values)} values but {len(weights)} weights")
    return values, weights


def _as_pairs(a, b) -> tuple[np.ndarray, np.ndarray]:
    a = np.asarray(a, dtype=float)
    b = np.asarray(b, dtype=float)
    if a.shape != b.shape or a.ndim != 1:
        raise PairingError(f"paired samples must be 1-D and equally long ({a.shape} vs {b.shape})")
    return a, b


def _is_constant(values: np.ndarray) -> bool:
    return bool(np.ptp(values) <= 1e-12 * max(1.0, float(np.max(np.abs(values)))))


def _tolerance(observed: float) -> float:
    # Floating-point slack so that a resample equal to the observed data counts as "as extreme".
    return 1e-12 * max(1.0, abs(float(observed)))


def _short(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return text if len(text) <= 40 else text[:37] + "..."


def _seed_list(values: Mapping[int, float]) -> str:
    seeds = sorted(values)
    return "seeds " + (",".join(map(str, seeds)) if seeds else "none")
