"""Swap-KL probes: zero for self-swaps and identical layers; the cached-prefix probe equals the
naive one full forward pass per variant."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from tiny import VOCAB

from prunelab.calibration import capture_layer_inputs
from prunelab.errors import ConfigError
from prunelab.models import ModelSpec, load_model
from prunelab.probes.swap import SwapProbe, interchange_order, layer_scores, replacement_order, token_kl
from prunelab.pruning.selectors import select_lowest, select_nonadjacent


@pytest.fixture(params=["llama", "gpt_neox"])
def loaded(request, tiny_model_dirs):
    return load_model(ModelSpec(name_or_path=str(tiny_model_dirs[request.param]), device="cpu"))


def ids():
    return torch.randint(0, VOCAB, (3, 10), generator=torch.Generator().manual_seed(5))


def naive_kl(loaded, order, tokens):
    """Full HF forward pass with the layers in `order`, KL to the dense pass, mean over tokens."""
    adapter = loaded.adapter
    with torch.no_grad():
        dense = F.log_softmax(loaded.model(input_ids=tokens, use_cache=False).logits.float(), -1)
        with adapter.layers_replaced([adapter.layers[k] for k in order]):
            probe = F.log_softmax(loaded.model(input_ids=tokens, use_cache=False).logits.float(), -1)
    return float(token_kl(dense, probe).mean())


def test_cached_prefix_probe_equals_naive_probe(loaded):
    tokens = ids()
    probe = SwapProbe(loaded.adapter, max_distance=2, progress=False)
    result = probe.run(capture_layer_inputs(loaded.adapter, tokens, batch_size=2))
    n = loaded.adapter.num_layers
    for i, j in result.pairs:
        assert result.interchange[i, j] == pytest.approx(naive_kl(loaded, interchange_order(n, i, j), tokens),
                                                         abs=1e-5)
        forward = naive_kl(loaded, replacement_order(n, i, j), tokens)
        backward = naive_kl(loaded, replacement_order(n, j, i), tokens)
        assert result.replacement_directed[i, j] == pytest.approx(forward, abs=1e-5)
        assert result.replacement[i, j] == pytest.approx(max(forward, backward), abs=1e-5)
    assert result.cost.ratio < 0.8  # the prefix before the first changed slot is never recomputed


def test_swapping_a_layer_with_itself_gives_zero(loaded):
    n = loaded.adapter.num_layers
    assert naive_kl(loaded, interchange_order(n, 1, 1), ids()) == pytest.approx(0.0, abs=1e-7)


def test_identical_layers_have_zero_replacement_and_interchange_distance(loaded):
    layers = loaded.adapter.layers
    layers[2].load_state_dict(layers[1].state_dict())
    result = SwapProbe(loaded.adapter, max_distance=1, progress=False).run(
        capture_layer_inputs(loaded.adapter, ids()))
    assert result.replacement[1, 2] == pytest.approx(0.0, abs=1e-6)
    assert result.interchange[1, 2] == pytest.approx(0.0, abs=1e-6)
    assert result.replacement[0, 1] > 1e-6  # a different pair is not zero


def test_mean_reduction_and_last_position():
    ref = F.log_softmax(torch.randn(2, 4, 7), -1)
    other = F.log_softmax(torch.randn(2, 4, 7), -1)
    full = token_kl(ref, other)
    last = token_kl(ref, other, positions="last")
    manual = (ref.exp() * (ref - other)).sum(-1)
    assert torch.allclose(full, manual.mean(1)) and torch.allclose(last, manual[:, -1])


def test_scores_and_greedy_removal_without_adjacent_layers():
    nan = math.nan
    d = torch.tensor([[nan, 0.1, 0.9, nan], [0.1, nan, 0.2, 0.8], [0.9, 0.2, nan, 0.05], [nan, 0.8, 0.05, nan]])
    scores = layer_scores(d)
    assert scores == pytest.approx([0.1, 0.1, 0.05, 0.05])
    none = frozenset()
    assert select_nonadjacent(scores, 2, none) == [0, 2]  # 2 first, then 3 is adjacent, then 0
    assert select_lowest(scores, 2, none) == [2, 3]  # the clustered variant allows neighbours
    with pytest.raises(ConfigError):
        select_nonadjacent(scores, 3, none)


@pytest.mark.parametrize("protocol", ["interchange", "replacement"])
def test_swap_scorers_guide_depth_pruning(tiny_model_dirs, protocol):
    from prunelab.context import PruneContext
    from prunelab.pruning.depth import DepthPruning
    from prunelab.pruning.scorers.swap import SwapKL

    loaded = load_model(ModelSpec(name_or_path=str(tiny_model_dirs["llama"]), device="cpu"))
    method = DepthPruning(SwapKL(protocol=protocol, max_distance=2), num_layers=2)
    ctx = PruneContext(loaded, seed=0, calibration=ids, progress=False)
    scores = method.score(ctx)
    report = method.prune(ctx, scores)
    removed = report.removed_layers
    assert len(removed) == 2 and abs(removed[0] - removed[1]) > 1  # never two adjacent
    expected = sorted(range(4), key=lambda i: (scores.per_layer[i], i))
    assert removed[0] == min(expected[0], removed[1]) or expected[0] in removed
    probe = report.details["swap_probe"]
    assert len(probe["gap"]) == len(probe["pairs"]) and loaded.adapter.num_layers == 2


def test_layer_matrices_are_found_for_heatmaps():
    from prunelab.tracking.trackers import layer_matrices

    details = {"pairwise": [[1.0, 0.5], [0.5, 1.0]], "layer_scores": [0.1, 0.2],
               "swap_probe": {"interchange": [[None, 0.1], [0.1, None]], "pairs": [[0, 1]]}}
    assert sorted(layer_matrices(details)) == ["pairwise", "swap_probe/interchange"]


def test_both_swap_scorers_share_one_cached_probe(tiny_model_dirs, tmp_path, monkeypatch):
    """The probe measures both matrices, so a sweep's interchange and replacement runs (every depth)
    measure it once per model, calibration data and settings; the cached result is the same."""
    from prunelab.context import PruneContext
    from prunelab.probes import swap as swap_probe
    from prunelab.pruning.scorers.base import ScoreRequest
    from prunelab.pruning.scorers.swap import SwapKL

    loaded = load_model(ModelSpec(name_or_path=str(tiny_model_dirs["llama"]), device="cpu"))
    ctx = PruneContext(loaded, seed=0, calibration=ids, progress=False, cache_dir=tmp_path)
    request = ScoreRequest(loaded.adapter.num_layers, 1)
    runs = []
    measure = swap_probe.SwapProbe.run
    monkeypatch.setattr(swap_probe.SwapProbe, "run",
                        lambda self, inputs: runs.append(1) or measure(self, inputs))

    fresh = SwapKL("interchange", max_distance=2).score(ctx, request)
    again = SwapKL("interchange", max_distance=2).score(ctx, request)
    other = SwapKL("replacement", max_distance=2).score(ctx, request)
    assert len(runs) == 1
    assert fresh.details["swap_probe"].pop("measured_here") is True
    assert again.details["swap_probe"].pop("measured_here") is False   # the record says so
    assert other.details["swap_probe"].pop("measured_here") is False  # read from the cache too
    assert again.per_layer == fresh.per_layer and again.details == fresh.details
    assert other.details == fresh.details                      # one probe, both matrices
    SwapKL("interchange", max_distance=1).score(ctx, request)  # other settings: measured anew
    other_data = PruneContext(loaded, seed=0, calibration=lambda: ids()[:2], progress=False,
                              cache_dir=tmp_path)
    SwapKL("interchange", max_distance=2).score(other_data, request)
    assert len(runs) == 3
