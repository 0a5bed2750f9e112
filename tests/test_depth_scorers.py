"""Depth-pruning scorers and selectors: hand cases, the tiny models, and their configs."""

from __future__ import annotations

import math

import pytest
import torch
from tiny import VOCAB

from prunelab.calibration.hidden_states import calibration_nll, removal_nlls
from prunelab.context import PruneContext
from prunelab.errors import ConfigError
from prunelab.models import ModelSpec, load_model
from prunelab.pruning.depth import DepthPruning
from prunelab.pruning.scorers.angular import AngularDistance
from prunelab.pruning.scorers.base import LayerScores, ScoreRequest
from prunelab.pruning.scorers.block_influence import BlockInfluence
from prunelab.pruning.scorers.random import RandomScorer
from prunelab.pruning.scorers.shortened import BlockMagnitude, BlockPerplexity, BlockTaylor
from prunelab.pruning.scorers.sleb import Sleb
from prunelab.pruning.scorers.streamline import Streamline
from prunelab.pruning.selectors import (
    check_removable, cluster_adjacent, protected_layers, select, select_contiguous, select_lowest,
)
from prunelab.scoring.layers import angular_distance, block_influence


def ids(n: int = 4, t: int = 12) -> torch.Tensor:
    return torch.randint(0, VOCAB, (n, t), generator=torch.Generator().manual_seed(1))


@pytest.fixture()
def llama(tiny_model_dirs):
    return load_model(ModelSpec(name_or_path=str(tiny_model_dirs["llama"]), device="cpu"))


def context(loaded, samples=None, seed=0) -> PruneContext:
    samples = ids() if samples is None else samples
    return PruneContext(loaded, seed, lambda: samples, batch_size=2, progress=False)


# --- pure layer scores ------------------------------------------------------------------------
def test_block_influence_by_hand():
    h_in = torch.tensor([[[1.0, 0.0], [0.0, 1.0]]])  # [1, 2, 2]
    h_out = torch.tensor([[[2.0, 0.0], [1.0, 1.0]]])  # token cosines 1 and 1/sqrt(2)
    expected = 1 - (1 + 1 / math.sqrt(2)) / 2
    assert block_influence(h_in, h_out).item() == pytest.approx(expected, abs=1e-6)
    # the dim=1 quirk: cosine over the 2 tokens of each channel: (1,0)·(2,1) and (0,1)·(0,1)
    quirk = 1 - (2 / math.sqrt(5) + 1.0) / 2
    assert block_influence(h_in, h_out, cosine_dim="tokens").item() == pytest.approx(quirk, abs=1e-6)


def test_angular_distance_by_hand():
    a = torch.tensor([[1.0, 0.0], [1.0, 0.0], [1.0, 0.0]])
    b = torch.tensor([[3.0, 0.0], [0.0, 2.0], [-1.0, 0.0]])
    torch.testing.assert_close(angular_distance(a, b), torch.tensor([0.0, 0.5, 1.0]))


def test_block_influence_matches_hidden_states_and_uses_the_prenorm_last_state(llama):
    samples = ids()
    captured = []
    handle = llama.adapter.final_norm.register_forward_pre_hook(lambda m, a: captured.append(a[0].detach()))
    with torch.no_grad():
        hs = list(llama.model(input_ids=samples, output_hidden_states=True, use_cache=False).hidden_states)
    handle.remove()
    hs[-1] = captured[0]  # transformers' last entry is after the final norm
    expected = [1 - torch.nn.functional.cosine_similarity(hs[i], hs[i + 1], dim=-1).mean().item()
                for i in range(4)]
    scores = BlockInfluence().score(context(llama, samples), ScoreRequest(4, 1))
    assert scores.per_layer == pytest.approx(expected, abs=1e-5)


def test_angular_and_streamline_give_contiguous_blocks(llama):
    ctx = context(llama)
    for scorer in (AngularDistance("last"), AngularDistance("all"), Streamline(), Streamline("tokens")):
        method = DepthPruning(scorer, num_layers=2)
        scores = method.score(ctx)
        valid = [s for s in scores.block_starts if s is not None]
        assert len(valid) == 3 and scores.block_starts[3] is None  # starts 0..2 for n = 2 of 4
        removed, _ = select(scores, "contiguous", 2, 4, frozenset())
        assert removed[1] == removed[0] + 1


def test_angular_and_streamline_scores_equal_transformers_hidden_states(llama):
    """Starts 0 and 1 of n = 2 read h_0..h_3, the un-normed entries of output_hidden_states."""
    with torch.no_grad():
        hs = llama.model(input_ids=ids(), output_hidden_states=True, use_cache=False).hidden_states
    angular = AngularDistance("last").score(context(llama), ScoreRequest(4, 2)).block_starts
    streamline = Streamline().score(context(llama), ScoreRequest(4, 2)).block_starts
    for start in (0, 1):
        a, b = hs[start], hs[start + 2]  # [N, T, C]
        cos_last = torch.nn.functional.cosine_similarity(a[:, -1].double(), b[:, -1].double(), dim=-1)  # [N]
        assert angular[start] == pytest.approx(float((torch.arccos(cos_last.clamp(-1, 1)) / math.pi).mean()),
                                               abs=1e-5)
        cos = torch.nn.functional.cosine_similarity(a.double(), b.double(), dim=-1)  # [N, T]
        assert streamline[start] == pytest.approx(1.0 - float(cos.mean()), abs=1e-5)


# --- SLEB and Shortened LLaMA -----------------------------------------------------------------
def test_sleb_never_removes_the_first_or_last_block_even_when_they_are_free(llama):
    adapter = llama.adapter
    with torch.no_grad():  # layers 0 and 3 now add nothing: removing either is exactly free
        for index in (0, 3):
            for writer in adapter.residual_writers(adapter.layers[index]):
                writer.weight.zero_()
    ctx = context(llama)
    single = BlockPerplexity().score(ctx, ScoreRequest(4, 2)).per_layer
    assert single[0] == pytest.approx(single[3], abs=1e-6)  # both equal the dense NLL
    method = DepthPruning(Sleb(), num_layers=2)
    report = method.prune(ctx, method.score(ctx))
    assert report.removed_layers == [1, 2]
    assert report.details["layer_scores"][0] is None and report.details["layer_scores"][3] is None
    assert len(report.details["step_nll"]) == 2


@pytest.mark.parametrize("arch", ["llama", "qwen3", "mistral", "gpt_neox", "opt"])
def test_removal_nlls_share_prefixes_and_equal_each_candidates_full_forward_to_the_bit(arch, tiny_model_dirs):
    loaded = load_model(ModelSpec(name_or_path=str(tiny_model_dirs[arch]), device="cpu"))
    adapter, samples = loaded.adapter, ids(5, 12)
    layers = list(adapter.layers)
    kept = [layers[j] for j in (0, 1, 3)]  # a search that has already removed layer 2
    shared = removal_nlls(adapter, samples, kept, [1, 2, 0], batch_size=2)
    assert sorted(shared) == [0, 1, 2]
    for k, value in shared.items():
        alone = calibration_nll(adapter, samples, 2, layers=[m for j, m in enumerate(kept) if j != k])
        assert value == alone  # exact: the same layer calls on the same batches
    assert len({round(v, 6) for v in shared.values()}) == 3  # three different models
    assert list(adapter.layers) == layers  # the model is restored


def test_sleb_replays_cached_steps_and_measures_only_the_new_ones(llama, tmp_path):
    def run(num_remove, cache_dir):
        ctx = PruneContext(llama, 0, lambda: ids(), batch_size=2, progress=False, cache_dir=cache_dir)
        return Sleb().score(ctx, ScoreRequest(4, num_remove))

    fresh = run(2, None)
    assert fresh.details["steps_measured_here"] == 2
    first = run(1, tmp_path)
    replayed = run(2, tmp_path)
    assert first.details["steps_measured_here"] == 1 and replayed.details["steps_measured_here"] == 1
    assert replayed.order == fresh.order and replayed.details["step_nll"] == fresh.details["step_nll"]
    assert run(2, tmp_path).details["steps_measured_here"] == 0
    other = PruneContext(llama, 0, lambda: ids(6), batch_size=2, progress=False, cache_dir=tmp_path)
    assert Sleb().score(other, ScoreRequest(4, 1)).details["steps_measured_here"] == 1  # other data


def test_shortened_magnitude_is_sum_of_abs_weights_and_plus_rule_is_its_default(llama):
    adapter = llama.adapter
    scores = BlockMagnitude().score(context(llama), ScoreRequest(4, 1)).per_layer
    expected = [sum(float(lin.weight.detach().abs().sum()) for lin in adapter.linears(layer).values())
                for layer in adapter.layers]
    assert scores == pytest.approx(expected, rel=1e-5)
    assert DepthPruning(BlockMagnitude()).plus_rule and DepthPruning(BlockTaylor()).plus_rule
    assert not DepthPruning(BlockMagnitude(), plus_rule=False).plus_rule
    assert protected_layers(8, plus_rule=True) == {0, 1, 2, 3, 6, 7}


def test_taylor_scores_are_sum_abs_weight_times_gradient_and_leave_no_gradients_behind(llama):
    flags = [p.requires_grad for p in llama.model.parameters()]
    scores = BlockTaylor().score(context(llama), ScoreRequest(4, 1)).per_layer
    weights = [[lin.weight for lin in llama.adapter.linears(layer).values()] for layer in llama.adapter.layers]
    flat = [w for ws in weights for w in ws]
    with torch.enable_grad():  # the loss summed over the scorer's batches of 2, by plain autograd
        loss = 0.0
        for batch in ids().split(2):
            logits = llama.model(input_ids=batch, use_cache=False).logits  # [2, T, V]
            loss = loss + torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                                                            batch[:, 1:].reshape(-1))
        grads = iter(torch.autograd.grad(loss, flat))  # loaded weights require grad
    expected = [sum(float((w.detach() * next(grads)).abs().sum()) for w in ws) for ws in weights]
    assert scores == pytest.approx(expected, rel=1e-4)
    assert all(p.grad is None for p in llama.model.parameters())
    assert [p.requires_grad for p in llama.model.parameters()] == flags


def test_random_is_seeded(llama):
    a = RandomScorer().score(context(llama, seed=3), ScoreRequest(4, 2)).per_layer
    b = RandomScorer().score(context(llama, seed=3), ScoreRequest(4, 2)).per_layer
    assert a == b == torch.rand(4, generator=torch.Generator().manual_seed(3)).tolist()


# --- selectors ----------------------------------------------------------------------------------
def test_lowest_and_contiguous_respect_protection():
    scores = [0.5, 0.1, 0.9, 0.2, 0.05, 0.3]
    assert select_lowest(scores, 2, frozenset()) == [1, 4]
    assert select_lowest(scores, 2, frozenset({4})) == [1, 3]
    per_layer = LayerScores(per_layer=scores)
    assert select_contiguous(per_layer, 2, 6, frozenset()) == [3, 4]  # 0.25 beats 0.6 / 1.0 / 1.1 / 0.35
    assert select_contiguous(per_layer, 2, 6, frozenset({4})) == [0, 1]
    block = LayerScores(block_starts=[0.3, None, 0.1, 0.2, None, None])
    assert select_contiguous(block, 2, 6, frozenset()) == [2, 3]


def test_cluster_merges_adjacent_similar_layers_and_keeps_the_first():
    sim = torch.eye(5)
    sim[1, 2] = sim[2, 1] = 0.9
    sim[2, 3] = sim[3, 2] = 0.8
    sim[1, 3] = sim[3, 1] = 0.7
    removed, groups = cluster_adjacent(sim.tolist(), 2, frozenset())
    assert removed == [2, 3] and groups == [[0], [1, 2, 3], [4]]
    removed, _ = cluster_adjacent(sim.tolist(), 2, frozenset({1}))  # the protected layer is the one kept
    assert removed == [2, 3]


def test_bad_depth_settings_are_config_errors():
    with pytest.raises(ConfigError, match="all 4"):
        check_removable(4, 4, frozenset())
    with pytest.raises(ConfigError, match="leaving 0 removable"):
        check_removable(4, 1, protected_layers(4, first=2, last=2))
    with pytest.raises(ConfigError, match="supports selector"):
        DepthPruning(Sleb(), selector="lowest")
    with pytest.raises(ConfigError, match="num_layers"):
        DepthPruning(BlockInfluence(), num_layers=-1)
    with pytest.raises(ConfigError, match="cosine_dim"):
        BlockInfluence(cosine_dim="time")


def test_too_many_layers_fail_before_any_forward(llama):
    with pytest.raises(ConfigError, match="would remove all"):
        DepthPruning(BlockInfluence(), num_layers=4).score(context(llama))
    with pytest.raises(ConfigError, match="protect rules"):
        DepthPruning(BlockMagnitude(), num_layers=1).score(context(llama))  # "+" keeps all 4 of 4


# --- configs ------------------------------------------------------------------------------------
def compose_config(overrides: list[str]):
    from hydra import compose, initialize_config_dir

    from prunelab.cli import CONF_DIR

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("config", overrides=overrides)


from prunelab.cli import group_options  # noqa: E402

SCORERS = group_options("pruning/scorer")


@pytest.mark.parametrize("scorer", SCORERS)
def test_every_scorer_config_builds(scorer, tmp_path):
    from prunelab.cli import build_setup

    setup = build_setup(compose_config(["model=llama2_7b", "pruning=depth", f"pruning/scorer={scorer}",
                                        f"paths.records_dir={tmp_path}"]))
    assert setup.pruning.scorer.name == scorer
    assert setup.pruning.labels()["layers_removed"] == 2


@pytest.mark.parametrize("override,message", [
    ("+pruning.scorer.typo=1", "typo"), ("pruning.selector=best", "selector"),
    ("pruning.num_layers=-2", "num_layers"),
])
def test_depth_config_is_airtight(override, message):
    from prunelab.cli import build_setup

    with pytest.raises(ConfigError, match=message):
        build_setup(compose_config(["model=llama2_7b", "pruning=depth", override]))
