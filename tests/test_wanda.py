"""Wanda: scores and masks by hand, the appendix variant, and the layer-sequential method on tiny models."""

from __future__ import annotations

import pytest
import torch
from tiny import VOCAB, assert_nm_pattern

import prunelab.pruning  # noqa: F401  first: importing prunelab.allocation first hits an import cycle
from prunelab.allocation.owl import OWL
from prunelab.calibration import SquaredColumnNorm
from prunelab.context import PruneContext
from prunelab.errors import ConfigError
from prunelab.models import ModelSpec, load_model
from prunelab.pruning.budget import SparsityBudget
from prunelab.pruning.masks import unstructured_mask
from prunelab.pruning.wanda import Wanda, wanda_variant_mask
from prunelab.scoring.weights import wanda_scores


def calibration(seed: int = 0, n: int = 4, t: int = 16) -> torch.Tensor:
    return torch.randint(0, VOCAB, (n, t), generator=torch.Generator().manual_seed(seed))


def context(model_dir, seed: int = 0, cache_dir=None) -> PruneContext:
    loaded = load_model(ModelSpec(name_or_path=str(model_dir), device="cpu"))
    samples = calibration(seed)
    return PruneContext(loaded, seed, lambda: samples, batch_size=2, progress=False, cache_dir=cache_dir)


def test_wanda_prunes_lowest_score_in_each_row():
    w = torch.tensor([[1.0, -4.0, 2.0, 3.0]])
    norm_sq = torch.tensor([16.0, 1.0, 1.0, 4.0])  # norms 4, 1, 1, 2
    # scores 4, 4, 2, 6 -> the two lowest are column 2, then 0 or 1 (stable order: 0)
    scores = wanda_scores(w, norm_sq)
    assert scores.tolist() == [[4.0, 4.0, 2.0, 6.0]]
    assert unstructured_mask(scores, 0.5, "row").tolist() == [[True, False, True, False]]


def test_the_input_norm_is_the_running_mean_of_squared_column_norms():
    stat = SquaredColumnNorm(2)
    a = torch.tensor([[1.0, 2.0], [3.0, 0.0]])  # one sample of 2 tokens: column sums of squares 10, 4
    b = torch.tensor([[0.0, 2.0], [0.0, 2.0], [2.0, 0.0], [0.0, 0.0]])  # two samples: 4, 8 in total
    stat.update(a, 1)
    stat.update(b, 2)
    assert stat.value.tolist() == pytest.approx([14 / 3, 12 / 3])


def test_variant_bisects_alpha_to_per_row_thresholds():
    scores = torch.tensor([[1.0, 2.0, 3.0, 4.0], [1.0, 1.0, 1.0, 7.0]])  # both rows sum to 10
    # alpha 0.4: row 0 cum (1, 3) <= 4 -> threshold 2 -> prunes 2; row 1 cum (1, 2, 3) <= 4 -> threshold 1
    # -> prunes its three 1s: 5/8 > 0.5, so alpha -> 0.2: row 0 prunes {1}, row 1 still its three 1s (ties)
    mask, alpha = wanda_variant_mask(scores, 0.5)
    assert alpha == pytest.approx(0.2)
    assert mask.tolist() == [[True, False, False, False], [True, True, True, False]]


def test_variant_row_with_no_fitting_prefix_keeps_everything():
    scores = torch.tensor([[5.0, 5.0], [1.0, 9.0]])
    mask, _ = wanda_variant_mask(scores, 0.25)
    assert not mask[0].any()  # the reference would gather index -1 and prune the whole row


def test_budget_carries_rounding_to_the_next_linear():
    budget = SparsityBudget("carry")
    w = torch.ones(4, 10)
    ratio = budget.ratio(0.53, w.shape, "row")  # 21.2 zeros wanted -> 5 per row -> 20
    assert int(ratio * 10) == 5
    w[:, :5] = 0
    budget.record(0.53, w)
    assert int(budget.ratio(0.53, w.shape, "row") * 10) == 6  # 22.4 wanted next: 6 per row -> 24
    assert SparsityBudget("floor").ratio(0.53, w.shape, "row") == 0.53


def test_layer0_masks_match_scores_from_the_dense_inputs(tiny_model_dirs):
    ctx = context(tiny_model_dirs["llama"])
    adapter = ctx.loaded.adapter
    layer0 = adapter.layers[0]
    linears = adapter.linears(layer0)
    seen = {name: [] for name in linears}
    handles = [lin.register_forward_hook(lambda m, a, o, n=name: seen[n].append(a[0].detach()))
               for name, lin in linears.items()]
    with torch.no_grad():
        ctx.loaded.model(input_ids=ctx.calibration(), use_cache=False)
    for h in handles:
        h.remove()
    expected = {}
    for name, lin in linears.items():
        x = torch.cat(seen[name])  # [N, T, in]
        norm_sq = (x.float() ** 2).sum(dim=1).mean(dim=0)  # [in]
        expected[name] = unstructured_mask(lin.weight.abs() * norm_sq.sqrt(), 0.5, "row")
    method = Wanda(sparsity=0.5)
    method.prune(ctx, method.allocate(ctx))
    for name, lin in linears.items():
        assert torch.equal(lin.weight == 0, expected[name]), name


@pytest.mark.parametrize("arch", ["llama", "gpt_neox", "opt"])
@pytest.mark.parametrize("pattern", ["2:4", "4:8"])
def test_nm_pattern_holds_on_every_row_of_every_linear(tiny_model_dirs, arch, pattern):
    n, m = map(int, pattern.split(":"))
    ctx = context(tiny_model_dirs[arch])
    method = Wanda(sparsity=n / m, sparsity_type=pattern)
    method.prune(ctx, method.allocate(ctx))
    assert_nm_pattern(ctx.loaded.adapter, n, m)


def test_same_seed_same_masks_and_dense_propagation_differs(tiny_model_dirs):
    masks = []
    for propagate in ("pruned", "pruned", "dense"):
        ctx = context(tiny_model_dirs["llama"], seed=3)
        method = Wanda(sparsity=0.5, propagate=propagate)
        method.prune(ctx, method.allocate(ctx))
        masks.append({k: lin.weight == 0 for k, lin in ctx.loaded.adapter.prunable_linears().items()})
    assert all(torch.equal(masks[0][k], masks[1][k]) for k in masks[0])
    assert not all(torch.equal(masks[0][k], masks[2][k]) for k in masks[0] if k.startswith("layers.3"))


def test_variant_runs_on_a_model_and_records_alpha(tiny_model_dirs):
    ctx = context(tiny_model_dirs["llama"])
    method = Wanda(sparsity=0.5, use_variant=True)
    report = method.prune(ctx, method.allocate(ctx))
    assert method.labels()["method"] == "wanda_variant"
    assert len(report.details["variant_alpha"]) == len(ctx.loaded.adapter.prunable_linears())
    assert all(0.0 <= a <= 0.8 for a in report.details["variant_alpha"].values())


@pytest.mark.parametrize("kwargs,message", [
    (dict(sparsity=0.5, sparsity_type="2:4", allocation=OWL()), "use pruning/allocation=uniform"),
    (dict(sparsity=0.6, sparsity_type="2:4"), "sparsity=0.5"),
    (dict(group="column"), "pruning.group"),
    (dict(propagate="sideways"), "pruning.propagate"),
    (dict(rounding="ceil"), "pruning.rounding"),
    (dict(sparsity=0.5, sparsity_type="2:4", use_variant=True), "use_variant"),
])
def test_bad_settings_are_config_errors(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        Wanda(**kwargs)
