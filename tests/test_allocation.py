"""Layer-wise allocation policies: hand-checked mappings, bounds and mean on a tiny model, measured
overall sparsity on target, seeds, and the on-disk cache of dense statistics."""

from __future__ import annotations

import json

import pytest
import torch
from tiny import VOCAB

from prunelab.allocation.alpha import AlphaPruning, alpha_sparsities, powerlaw_alpha
from prunelab.allocation.bounds import centred_band
from prunelab.allocation.gradient import GradientAllocation
from prunelab.allocation.owl import OWL, outlier_ratio, owl_sparsities
from prunelab.allocation.pals import PALS
from prunelab.allocation.random import RandomAllocation
from prunelab.calibration import passes
from prunelab.calibration.dense_statistics import DenseStatistics
from prunelab.calibration.statistics import AbsHistogram, histogram_quantile
from prunelab.context import PruneContext
from prunelab.errors import ConfigError
from prunelab.models import ModelSpec, load_model
from prunelab.pruning.report import sparsity_report
from prunelab.pruning.sparsegpt import SparseGPT
from prunelab.pruning.wanda import Wanda

S = 0.5


def context(model_dir, seed=0, cache_dir=None) -> PruneContext:
    loaded = load_model(ModelSpec(name_or_path=str(model_dir), device="cpu"))
    samples = torch.randint(0, VOCAB, (4, 16), generator=torch.Generator().manual_seed(seed))
    return PruneContext(loaded, seed, lambda: samples, batch_size=2, progress=False, cache_dir=cache_dir)


# --- pure mappings ------------------------------------------------------------------------------

def test_centred_band_keeps_order_bounds_and_the_weighted_mean():
    weights = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64)
    values = [4.0, 1.0, 3.0, 2.0]
    out = centred_band(values, 0.6, 0.05, weights)  # higher value -> lower sparsity
    assert sorted(range(4), key=lambda i: out[i]) == [0, 2, 3, 1]
    assert all(0.55 - 1e-12 <= s <= 0.65 + 1e-12 for s in out)
    assert max(abs(s - 0.6) for s in out) == pytest.approx(0.05)  # the farthest layer sits on the bound
    assert float((torch.tensor(out, dtype=torch.float64) * weights).sum()) == pytest.approx(0.6, abs=1e-12)
    assert centred_band([2.0, 2.0, 2.0], 0.6, 0.05, torch.full((3,), 1 / 3)) == [0.6] * 3


def test_owl_band_is_centred_on_the_mean_of_d_not_on_s():
    plain = torch.full((4,), 0.25, dtype=torch.float64)
    # D = 0, 0, 0, 1 -> scaled to [0, 0.16]; mean 0.04 -> s = S + 0.04 three times and S - 0.12 once
    out = owl_sparsities([0.0, 0.0, 0.0, 1.0], S, 0.08, plain)
    assert out == pytest.approx([S + 0.04, S + 0.04, S + 0.04, S - 0.12])
    assert owl_sparsities([0.3, 0.3, 0.3, 0.3], S, 0.08, plain) == [S] * 4  # the reference gives NaN


def test_outlier_ratio_counts_scores_above_m_times_the_block_mean():
    scores = [torch.tensor([[1.0, 1.0], [1.0, 1.0]]), torch.tensor([[1.0, 11.0]])]  # mean 16 / 6
    assert outlier_ratio(scores, 3.0) == pytest.approx(1 / 6)  # 11 > 8


def test_alpha_mapping_is_linear_in_alpha_with_a_parameter_weighted_mean():
    weights = torch.tensor([0.5, 0.25, 0.25], dtype=torch.float64)
    out = alpha_sparsities([2.0, 3.0, 4.0], S, 0.3, weights)  # ratios 0.7, 1.0, 1.3; weighted mean 0.925
    assert out == pytest.approx([S * 0.7 / 0.925, S * 1.0 / 0.925, S * 1.3 / 0.925])
    assert float((torch.tensor(out, dtype=torch.float64) * weights).sum()) == pytest.approx(S)


def test_hill_estimator_recovers_a_power_law_exponent():
    g = torch.Generator().manual_seed(0)
    eigs = (1 - torch.rand(4000, generator=g, dtype=torch.float64)) ** (-1 / 2.0)  # density ~ x^-3, xmin 1
    assert powerlaw_alpha(eigs, xmin="mid") == pytest.approx(3.0, abs=0.25)
    assert powerlaw_alpha(eigs, xmin="peak") == pytest.approx(3.0, abs=0.25)


def test_histogram_percentile_is_within_its_bin_resolution():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(200, 64, generator=g) * torch.logspace(-2, 1, 64)  # channels on different scales
    hist = AbsHistogram(64)
    hist.update(x[:120], 1)
    hist.update(x[120:], 1)
    exact = float(torch.quantile(x.abs().flatten(), 0.99))
    assert histogram_quantile(hist.counts, 0.99) == pytest.approx(exact, rel=0.01)


# --- policies on a tiny model --------------------------------------------------------------------

POLICIES = {
    "owl": lambda: OWL(), "pals": lambda: PALS(), "gradient": lambda: GradientAllocation(),
    "random": lambda: RandomAllocation(), "alpha": lambda: AlphaPruning(),
    "pals_params": lambda: PALS(mean="params"), "owl_params": lambda: OWL(mean="params"),
}


def band(policy, target):
    """(low, high) a policy promises around the target."""
    if isinstance(policy, OWL):
        return target - 2 * policy.lam, target + 2 * policy.lam
    if isinstance(policy, AlphaPruning):
        eps = policy.epsilon  # [S(1 - eps), S(1 + eps)] times a common factor 1 / mean(ratio)
        return target * (1 - eps) / (1 + eps), target * (1 + eps) / (1 - eps)
    return target - policy.band.bound, target + policy.band.bound


@pytest.mark.parametrize("name", list(POLICIES))
def test_policy_bounds_mean_details_and_measured_overall_sparsity(tiny_model_dirs, name, tmp_path):
    policy = POLICIES[name]()
    ctx = context(tiny_model_dirs["llama"], cache_dir=tmp_path)
    method = Wanda(sparsity=S, allocation=policy, rounding="carry")  # on target overall (the switch)
    targets = method.allocate(ctx)
    low, high = band(policy, S)
    assert len(targets) == 4 and all(low - 1e-9 <= t <= high + 1e-9 for t in targets)
    assert len(set(round(t, 9) for t in targets)) > 1  # not uniform on a random model
    assert sum(targets) / 4 == pytest.approx(S, abs=1e-9)  # all tiny layers have the same size
    report = method.prune(ctx, targets)
    details = json.loads(json.dumps(report.details))  # JSON-able
    assert details["allocation"]["policy"] == policy.name
    assert details["allocation"]["layer_targets"] == pytest.approx(targets)
    overall = sparsity_report(ctx.loaded.adapter, report.layer_targets)["overall"]
    assert abs(overall - S) <= 0.001


def test_allocation_with_sparsegpt_meets_the_overall_target(tiny_model_dirs):
    ctx = context(tiny_model_dirs["gpt_neox"], seed=2)
    method = SparseGPT(sparsity=0.6, allocation=RandomAllocation(bound=0.1), rounding="carry", ties="exact")
    report = method.prune(ctx, method.allocate(ctx))
    assert abs(sparsity_report(ctx.loaded.adapter, report.layer_targets)["overall"] - 0.6) <= 0.001


def test_random_allocation_follows_the_seed(tiny_model_dirs):
    ctx0, ctx1 = context(tiny_model_dirs["llama"], seed=0), context(tiny_model_dirs["llama"], seed=1)
    policy = RandomAllocation()
    stats0, stats1 = DenseStatistics(ctx0), DenseStatistics(ctx1)
    assert policy.allocate(S, stats0) == policy.allocate(S, stats0)
    assert policy.allocate(S, stats0) != policy.allocate(S, stats1)


def test_same_seed_same_masks_with_a_data_aware_allocation(tiny_model_dirs):
    masks = []
    for _ in range(2):
        ctx = context(tiny_model_dirs["llama"], seed=5)
        method = Wanda(sparsity=S, allocation=PALS())
        method.prune(ctx, method.allocate(ctx))
        masks.append([lin.weight == 0 for lin in ctx.loaded.adapter.prunable_linears().values()])
    assert all(torch.equal(a, b) for a, b in zip(*masks))


def test_dense_statistics_are_cached_once_per_model_and_data(tiny_model_dirs, tmp_path, monkeypatch):
    ctx = context(tiny_model_dirs["llama"], cache_dir=tmp_path)
    seen = []
    dense_pass = passes.dense_role_statistics
    monkeypatch.setattr("prunelab.calibration.dense_statistics.dense_role_statistics",
                        lambda *a, **k: seen.append(1) or dense_pass(*a, **k))
    first = OWL(lam=0.08).allocate(S, DenseStatistics(ctx))
    second = OWL(lam=0.05).allocate(0.6, DenseStatistics(ctx))  # another setting of the sweep: no new pass
    assert len(seen) == 1 and len(list((tmp_path / "allocation").glob("squared_column_norm-*.pt"))) == 1
    assert max(first) - min(first) == pytest.approx(0.16) and max(second) - min(second) == pytest.approx(0.1)
    other = context(tiny_model_dirs["llama"], seed=9, cache_dir=tmp_path)  # other calibration data
    OWL().allocate(S, DenseStatistics(other))
    assert len(seen) == 2
    OWL().allocate(S, DenseStatistics(context(tiny_model_dirs["llama"])))  # no cache_dir: nothing written
    assert len(seen) == 3 and len(list((tmp_path / "allocation").iterdir())) == 2


def test_dense_pass_propagates_dense_outputs(tiny_model_dirs, monkeypatch):
    seen = []
    runner = passes.LayerSequentialRunner
    monkeypatch.setattr(passes, "LayerSequentialRunner",
                        lambda *a, **k: seen.append(k["propagate"]) or runner(*a, **k))
    PALS().allocate(S, DenseStatistics(context(tiny_model_dirs["llama"])))
    assert seen == ["dense"]


@pytest.mark.parametrize("make,message", [
    (lambda: Wanda(sparsity=0.5, sparsity_type="2:4", allocation=PALS()), "allocation=uniform"),
    (lambda: SparseGPT(sparsity=0.5, sparsity_type="4:8", allocation=AlphaPruning()), "allocation=uniform"),
    (lambda: Wanda(sparsity=0.98, allocation=RandomAllocation()), "outside"),
    (lambda: PALS(mean="median"), "mean"),
    (lambda: PALS(percentile=0), "percentile"),
    (lambda: OWL(outlier_m=0), "outlier_m"),
    (lambda: AlphaPruning(epsilon=1.5), "epsilon"),
    (lambda: GradientAllocation(bound=-0.1), "bound"),
])
def test_bad_allocation_settings_are_config_errors(make, message):
    with pytest.raises(ConfigError, match=message):
        make()


def test_alpha_fit_makes_its_tensors_on_the_eigenvalues_device():
    """Eigenvalues from svdvals live on the weight's device (a GPU for users); the fit's own
    tensors must too. Meta tensors stand in for CUDA here: a CPU tensor beside them raises."""
    from prunelab.allocation.alpha import _fit

    eigs = torch.empty(64, dtype=torch.float64, device="meta")  # [N]
    alpha, distance = _fit(eigs, eigs.log(), torch.arange(4, device="meta"))
    assert alpha.device.type == distance.device.type == "meta" and alpha.shape == (4,)
