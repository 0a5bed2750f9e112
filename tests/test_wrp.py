"""WRP: the Gram form ignores head and FFN-neuron order, the raw form does not; scale; selection."""

from __future__ import annotations

import pytest
import torch

from prunelab.context import PruneContext
from prunelab.models import ModelSpec, load_model
from prunelab.pruning.depth import DepthPruning
from prunelab.pruning.scorers.wrp import WeightRedundancy
from prunelab.scoring.wrp import gram_cka, raw_cosine, redundancy_scores, relative_scale, wrp_matrix

C, HEADS, HEAD_DIM, FFN = 16, 4, 4, 24


def weights(n: int, cols: int, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(C, cols, generator=g) for _ in range(n)]  # nn.Linear layout [C, in]


def test_gram_form_is_invariant_to_permuting_heads_and_neurons_raw_form_is_not():
    attn, mlp = weights(3, HEADS * HEAD_DIM, 0), weights(3, FFN, 1)
    attn[1] = attn[0] + 0.3 * attn[1]  # make the pair (0, 1) similar, so the raw cosine is informative
    mlp[1] = mlp[0] + 0.3 * mlp[1]
    heads = torch.tensor([2, 0, 3, 1])
    head_perm = (heads[:, None] * HEAD_DIM + torch.arange(HEAD_DIM)).reshape(-1)  # whole heads move
    neuron_perm = torch.randperm(FFN, generator=torch.Generator().manual_seed(2))
    attn_p = [attn[0], attn[1][:, head_perm], attn[2]]
    mlp_p = [mlp[0], mlp[1][:, neuron_perm], mlp[2]]
    before = wrp_matrix(attn, mlp, "gram")["similarity"]  # [3, 3]
    after = wrp_matrix(attn_p, mlp_p, "gram")["similarity"]
    torch.testing.assert_close(before, after, atol=1e-5, rtol=1e-5)
    raw_before = wrp_matrix(attn, mlp, "raw")["similarity"]
    raw_after = wrp_matrix(attn_p, mlp_p, "raw")["similarity"]
    assert abs(raw_before[0, 1] - raw_after[0, 1]) > 0.1


def test_similarity_matrices_are_symmetric_with_unit_diagonal():
    ws = weights(4, 12)
    for sim in (gram_cka(ws), raw_cosine(ws)):
        torch.testing.assert_close(sim, sim.T)
        torch.testing.assert_close(sim.diagonal(), torch.ones(4))
    assert gram_cka([ws[0], 2.5 * ws[0]])[0, 1].item() == pytest.approx(1.0, abs=1e-6)  # scale-free...


def test_relative_scale_is_min_over_max_of_norms():
    scale = relative_scale(torch.tensor([1.0, 2.0, 4.0]))
    torch.testing.assert_close(scale, torch.tensor([[1.0, 0.5, 0.25], [0.5, 1.0, 0.5], [0.25, 0.5, 1.0]]))
    w = weights(1, 12)[0]
    combined = wrp_matrix([w, 2 * w], [w, 2 * w], "gram")["similarity"]
    assert combined[0, 1].item() == pytest.approx(0.5, abs=1e-5)  # ...the scale term is what sees 2x


def test_redundancy_is_one_minus_best_match():
    sim = torch.tensor([[1.0, 0.9, 0.1], [0.9, 1.0, 0.3], [0.1, 0.3, 1.0]])
    torch.testing.assert_close(redundancy_scores(sim), torch.tensor([0.1, 0.1, 0.7]))


def test_wrp_on_a_tiny_model_records_all_pairs_and_needs_no_data(tiny_model_dirs):
    loaded = load_model(ModelSpec(name_or_path=str(tiny_model_dirs["qwen2"]), device="cpu"))

    def no_data():
        raise AssertionError("WRP is forward-free")

    ctx = PruneContext(loaded, 0, no_data, progress=False)
    method = DepthPruning(WeightRedundancy("gram"), num_layers=2)
    report = method.prune(ctx, method.score(ctx))
    assert len(report.removed_layers) == 2 and loaded.adapter.num_layers == 2
    assert len(report.details["pairwise"]) == 4 and len(report.details["pairwise_attn_out"][0]) == 4
    assert report.details["selector"] == "cluster" and "groups" in report.details["selection"]
