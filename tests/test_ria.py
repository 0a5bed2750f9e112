"""RIA (pruning=ria): its score, its channel permutation for N:M, its settings; the masks against the
reference's oracle are in test_faithful_references.py."""

from __future__ import annotations

import pytest
import torch

from prunelab.errors import ConfigError
from prunelab.pruning.channel_permutation import (
    assignment_order, kept_score_matrix, permuted_nm_mask, reallocation_order,
)
from prunelab.pruning.masks import nm_mask
from prunelab.pruning.ria import RIA
from prunelab.scoring.weights import ria_scores


def test_relative_importance_counts_a_weight_against_its_column_and_its_row():
    w = torch.tensor([[1.0, -3.0],
                      [1.0, 1.0]])
    # column totals 2, 4; row totals 4, 2 -> RI = [[1/2 + 1/4, 3/4 + 3/4], [1/2 + 1/2, 1/4 + 1/2]]
    norm_sq = torch.tensor([16.0, 1.0])  # ||X|| = 4, 1 -> ** 0.5 = 2, 1
    expected = torch.tensor([[0.75 * 2, 1.5 * 1], [1.0 * 2, 0.75 * 1]])
    torch.testing.assert_close(ria_scores(w, norm_sq, a=0.5), expected)
    torch.testing.assert_close(ria_scores(w, norm_sq, a=0.0), expected / torch.tensor([2.0, 1.0]))


def test_reallocation_deals_one_channel_of_each_band_to_every_group():
    scores = torch.tensor([[8.0, 1.0, 6.0, 3.0, 5.0, 2.0, 7.0, 4.0]])  # column sums as given
    order = reallocation_order(scores, m=4)  # ascending: 1 5 3 7 | 4 2 6 0; bands of 2
    # band 0 (cols 1, 5) forwards at position 0, band 1 (3, 7) reversed at 1, band 2 (4, 2)
    # forwards at 2, band 3 (6, 0) reversed at 3
    assert order.tolist() == [1, 7, 4, 0, 5, 3, 2, 6]
    mask = permuted_nm_mask(scores, 2, 4, order)
    assert mask.sum() == 4 and nm_mask(scores[:, order], 2, 4).tolist() == mask[:, order].tolist()


def test_the_assignment_keeps_at_least_the_score_it_starts_from():
    torch.manual_seed(0)
    scores = torch.rand(16, 32) ** 3  # [out, in]: skewed, so groups matter
    start = reallocation_order(scores, 4)

    def kept(order):
        return float((scores * ~permuted_nm_mask(scores, 2, 4, order)).sum())

    refined = assignment_order(scores, start, 2, 4)
    assert sorted(refined.tolist()) == list(range(32))  # a permutation
    assert kept(refined) >= kept(start) - 1e-5
    assert kept(refined) > kept(torch.arange(32))  # better than no permutation on skewed scores
    # the kept-score matrix's diagonal is each group keeping its own channels
    matrix = kept_score_matrix(scores, 0, 2, 4)
    own = (scores * ~nm_mask(scores, 2, 4)).reshape(16, 8, 4).sum(dim=(0, 2))
    torch.testing.assert_close(matrix.diagonal(), own)


@pytest.mark.parametrize(("settings", "message"), [
    ({"permutation": "lsa"}, "reorders channels for N:M"),
    ({"sparsity_type": "2:4", "permutation": "optimal"}, "not one of none, heuristic, lsa"),
    ({"sparsity_type": "2:4", "lsa_fast": True}, "set pruning.permutation=lsa"),
    ({"a": -1}, "activation exponent"),
])
def test_bad_settings_are_one_line(settings, message):
    with pytest.raises(ConfigError, match=message) as err:
        RIA(**settings)
    assert "\n" not in str(err.value)


def test_ria_through_the_api_prunes_to_the_target_and_labels_its_permutation(tiny_model_dirs):
    import prunelab

    model, tokenizer = prunelab.load(tiny_model_dirs["llama"])
    ids = torch.randint(0, 100, (4, 16), generator=torch.Generator().manual_seed(0))  # [N, T]
    report = prunelab.prune(model, tokenizer, method="ria", sparsity_type="2:4", permutation="heuristic",
                            calibration=ids, progress=False)
    assert report["labels"]["method"] == "ria" and report["labels"]["permutation"] == "heuristic"
    assert report["sparsity"]["overall"] == pytest.approx(0.5)
