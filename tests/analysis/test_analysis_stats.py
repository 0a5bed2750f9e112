"""prunelab.analysis.stats on small, hand-checkable numbers."""

import math

import numpy as np
import pytest
from scipy import stats as scipy_stats

from prunelab.analysis import stats

# --------------------------------------------------------------------------- Holm


def test_holm_matches_hand_computed_case():
    # sorted: 0.005*4=0.02, 0.01*3=0.03, 0.03*2=0.06, 0.04*1=0.04 -> monotone max -> 0.06
    adjusted = stats.holm([0.01, 0.04, 0.03, 0.005])
    np.testing.assert_allclose(adjusted, [0.03, 0.06, 0.06, 0.02])


def test_holm_step_down_keeps_order_monotone_by_hand():
    # m = 3, sorted 0.02, 0.03, 0.04: 3*0.02 = 0.06, 2*0.03 = 0.06, 1*0.04 = 0.04 -> the running
    # max lifts the last one to 0.06; so all three are 0.06 (Holm never lets a larger raw p get a
    # smaller adjusted p).
    np.testing.assert_allclose(stats.holm([0.04, 0.02, 0.03]), [0.06, 0.06, 0.06])
    # m = 2, sorted 0.001, 0.2: 2*0.001 = 0.002, 1*0.2 = 0.2.
    np.testing.assert_allclose(stats.holm([0.2, 0.001]), [0.2, 0.002])
    assert stats.holm([]).shape == (0,)


def test_holm_caps_at_one_and_ignores_nan():
    adjusted = stats.holm([0.5, math.nan, 0.6])
    assert math.isnan(adjusted[1])
    np.testing.assert_allclose(adjusted[[0, 2]], [1.0, 1.0])  # family size 2, not 3
    np.testing.assert_allclose(stats.holm([0.01, math.nan]), [0.01, math.nan])


# --------------------------------------------------------------------------- across seeds


def test_t_test_and_wilcoxon_are_scipys():
    a, b = [10.9, 11.2, 10.7, 11.0, 10.8, 11.1], [12.9, 13.1, 12.6, 13.3, 12.7, 12.8]
    assert stats.paired_t_test(a, b).pvalue == scipy_stats.ttest_rel(a, b).pvalue
    assert stats.wilcoxon_signed_rank(a, b).pvalue == scipy_stats.wilcoxon(a, b).pvalue
    assert stats.wilcoxon_signed_rank(a, b).note == ""  # n=6 can reach p<0.05


def test_wilcoxon_degenerate_cases_give_nan_with_note():
    zero = stats.wilcoxon_signed_rank([1.0, 2.0, 3.0], [1.0, 2.0, 3.0])
    assert math.isnan(zero.pvalue) and "all paired differences are zero" in zero.note
    single = stats.wilcoxon_signed_rank([1.0], [2.0])
    assert math.isnan(single.pvalue) and "n=1" in single.note
    small = stats.wilcoxon_signed_rank([1.0, 2.0, 3.0], [2.0, 3.5, 5.0])
    assert small.pvalue == pytest.approx(0.25) and "cannot reach p<0.05" in small.note


def test_t_test_with_constant_differences_is_nan_with_note():
    result = stats.paired_t_test([1.0, 2.0, 3.0], [2.0, 3.0, 4.0])
    assert math.isnan(result.pvalue) and "constant" in result.note


def test_bootstrap_ci_is_reproducible_and_brackets_the_mean_difference():
    a, b = [10.9, 11.2, 10.7, 11.4], [12.9, 13.0, 12.8, 13.6]
    first = stats.bootstrap_mean_difference(a, b, seed=3)
    again = stats.bootstrap_mean_difference(a, b, seed=3)
    assert (first.low, first.high) == (again.low, again.high)
    mean_difference = np.mean(np.subtract(a, b))
    assert first.low <= mean_difference <= first.high < 0


def test_pairing_refuses_different_protocols_and_names_the_field():
    stamp = {"evaluator": "perplexity", "seqlen": 2048, "dataset": "wikitext2"}
    other = dict(stamp, seqlen=4096)
    with pytest.raises(stats.PairingError, match="seqlen 2048 vs 4096"):
        stats.pair_by_seed({0: 1.0}, {0: 2.0}, stamp, other)
    assert stats.protocol_differences(stamp, dict(stamp)) == []


def test_pairing_refuses_disjoint_seeds_and_pairs_shared_ones():
    with pytest.raises(stats.PairingError, match="no shared seeds"):
        stats.pair_by_seed({0: 1.0, 1: 2.0}, {2: 1.0})
    seeds, a, b = stats.pair_by_seed({2: 3.0, 0: 1.0, 5: 9.0}, {0: 10.0, 2: 30.0})
    assert seeds == [0, 2] and list(a) == [1.0, 3.0] and list(b) == [10.0, 30.0]


def test_compare_across_seeds_collects_everything():
    result = stats.compare_across_seeds({0: 1.0, 1: 2.0, 2: 3.5}, {0: 2.0, 1: 3.5, 2: 4.0})
    assert result.n == 3
    assert result.mean_difference == pytest.approx(-1.0)
    assert result.p_t == scipy_stats.ttest_rel([1.0, 2.0, 3.5], [2.0, 3.5, 4.0]).pvalue
    assert any("Wilcoxon" in note for note in result.notes)


# --------------------------------------------------------------------------- two single runs


def test_weighted_perplexity_by_hand():
    assert stats.weighted_perplexity([1.0, 2.0], [1, 3]) == pytest.approx(math.exp(7 / 4))


def test_paired_bootstrap_identical_runs_give_zero_and_p_one():
    samples = {"values": [1.7, 1.6, 1.9, 1.8, 1.5], "weights": [128] * 5}
    result = stats.paired_bootstrap_perplexity(samples, samples, n_resamples=999)
    assert result.difference == 0.0
    assert (result.ci_low, result.ci_high) == (0.0, 0.0)
    assert result.pvalue == 1.0


def test_paired_bootstrap_strictly_better_on_every_window_excludes_zero():
    worse = {"values": [1.7, 1.6, 1.9, 1.8, 1.5, 2.0, 1.65, 1.75], "weights": [128] * 8}
    better = {"values": [v - 0.1 for v in worse["values"]], "weights": worse["weights"]}
    result = stats.paired_bootstrap_perplexity(better, worse, n_resamples=999)
    assert result.difference < 0
    assert result.ci_low <= result.difference <= result.ci_high < 0
    assert result.pvalue < 0.01
    assert result.perplexity_a == pytest.approx(stats.weighted_perplexity(better["values"]))


def test_paired_bootstrap_refuses_different_window_counts():
    with pytest.raises(stats.PairingError):
        stats.paired_bootstrap_perplexity({"values": [1.0, 2.0]}, {"values": [1.0, 2.0, 3.0]})


def test_mcnemar_by_hand():
    # 5 items only a gets right, 1 only b gets right, 4 both right, 2 both wrong.
    a = [1] * 5 + [0] + [1] * 4 + [0] * 2
    b = [0] * 5 + [1] + [1] * 4 + [0] * 2
    result = stats.mcnemar(a, b)
    assert (result.a_only, result.b_only, result.n_items) == (5, 1, 12)
    # exact: 6 discordant items, X ~ Bin(6, 1/2), observed min(5, 1) = 1;
    # p = 2 * P(X <= 1) = 2 * (C(6,0) + C(6,1)) / 2**6 = 2 * 7 / 64 = 14/64 = 0.21875.
    assert result.p_exact == pytest.approx(14 / 64)
    # chi-square with continuity correction: (|5 - 1| - 1)**2 / (5 + 1) = 9/6 = 1.5;
    # with 1 df, P(chi2 > x) = P(|Z| > sqrt(x)) = erfc(sqrt(x / 2)) = erfc(sqrt(0.75)) ~ 0.2207.
    assert result.chi2 == pytest.approx(1.5)
    assert result.p_chi2 == pytest.approx(math.erfc(math.sqrt(0.75)))
    assert result.p_chi2 == pytest.approx(0.2207, abs=1e-4)
    assert result.difference == pytest.approx(4 / 12)


def test_mcnemar_all_discordant_one_way_by_hand():
    # 4 items, a right and b wrong on every one: p = 2 * P(X <= 0), X ~ Bin(4, 1/2) = 2/16.
    # chi-square: (|4 - 0| - 1)**2 / 4 = 9/4 = 2.25.
    result = stats.mcnemar([1, 1, 1, 1], [0, 0, 0, 0])
    assert result.p_exact == pytest.approx(2 / 16)
    assert result.chi2 == pytest.approx(2.25)
    assert result.p_chi2 == pytest.approx(math.erfc(math.sqrt(2.25 / 2)))


def test_mcnemar_identical_runs_p_one():
    result = stats.mcnemar([1, 0, 1, 1], [1, 0, 1, 1])
    assert (result.p_exact, result.p_chi2, result.difference) == (1.0, 1.0, 0.0)


def test_t_interval_never_has_a_negative_half_width():
    # Seeds that agree to the last bit but one: the interval must still bracket the mean.
    values = [0.1 + 0.2, 0.3, 0.30000000000000004]
    low, high = stats.mean_confidence_interval(values)
    mean = float(np.mean(values))
    assert low <= mean <= high


def test_t_interval_by_hand():
    # values 1, 2, 3: mean 2, sd 1, sem 1/sqrt(3); t(0.975, 2 df) = 4.302653 (t table), so the
    # half-width is 4.302653 / sqrt(3) = 2.484138.
    low, high = stats.mean_confidence_interval([1.0, 2.0, 3.0])
    assert (low, high) == (pytest.approx(2 - 2.484138, abs=1e-5), pytest.approx(2 + 2.484138,
                                                                                abs=1e-5))
