"""Mask functions on hand-computed cases."""

from __future__ import annotations

import pytest
import torch

from prunelab.errors import ConfigError
from prunelab.pruning.masks import check_sparsity, make_mask, nm_mask, unstructured_mask


def test_matrix_group_prunes_exactly_k_lowest():
    scores = torch.tensor([[4.0, 1.0, 3.0], [2.0, 6.0, 5.0]])
    # 6 weights at 50% -> k = 3: the scores 1, 2, 3
    assert unstructured_mask(scores, 0.5, "matrix").tolist() == [[False, True, True], [True, False, False]]


def test_reference_ties_prune_k_plus_one_and_every_tie():
    scores = torch.tensor([[1.0, 2.0, 2.0, 2.0, 5.0, 6.0]])
    # k = 3; the reference threshold is the sorted value at index 3 (= 2.0): everything <= 2 goes
    assert unstructured_mask(scores, 0.5, "matrix", ties="reference").sum() == 4
    # exact: scores 1 then the first two 2s by position
    assert unstructured_mask(scores, 0.5, "matrix").tolist() == [[True, True, True, False, False, False]]


def test_row_group_prunes_the_same_count_in_every_row():
    scores = torch.tensor([[1.0, -4.0, 2.0, 3.0], [9.0, 8.0, 7.0, 6.0]]).abs()
    mask = unstructured_mask(scores, 0.5, "row")
    assert mask.tolist() == [[True, False, True, False], [False, False, True, True]]


def test_block128_thresholds_each_block_separately():
    scores = torch.cat([torch.zeros(2, 128), torch.ones(2, 128)], dim=1) + torch.rand(2, 256) * 0.1
    mask = unstructured_mask(scores, 0.5, "block128")
    assert mask[:, :128].sum() == mask[:, 128:].sum() == 128  # a matrix threshold would take block 1 only


def test_nm_prunes_n_of_every_m_consecutive_weights():
    scores = torch.tensor([[4.0, 3.0, 2.0, 1.0, 1.0, 2.0, 3.0, 4.0]])
    mask = nm_mask(scores, 2, 4)
    assert mask.tolist() == [[False, False, True, True, True, True, False, False]]
    big = nm_mask(torch.rand(16, 64), 2, 4).view(16, 16, 4)
    assert (big.sum(-1) == 2).all()


def test_zero_sparsity_prunes_nothing():
    assert not make_mask(torch.rand(4, 8), 0.0).any()


@pytest.mark.parametrize("sparsity,kind,message", [
    (0.5, "2:5", "2/5"), (1.0, "unstructured", "outside"), (-0.1, "unstructured", "outside"),
    (0.5, "4:2", "0 < N < M"), (0.5, "half", "N:M"),
])
def test_bad_sparsity_settings_are_config_errors(sparsity, kind, message):
    with pytest.raises(ConfigError, match=message):
        check_sparsity(sparsity, kind)
