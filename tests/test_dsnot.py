"""DSnoT (pruning/refine=dsnot): its prune-and-grow rule on hand-checked rows, its statistics, its
one-line errors and the API; the masks against the reference's oracle are in
test_faithful_references.py."""

from __future__ import annotations

import pytest
import torch
from tiny import VOCAB
from transformers import AutoModelForCausalLM, AutoTokenizer

import prunelab
from prunelab.calibration.statistics import InputMoments
from prunelab.config import build, compose_config
from prunelab.errors import ConfigError
from prunelab.pruning.dsnot import DSnoT, dsnot_refine_mask, dsnot_refine_nm_mask, sign_split_order
from prunelab.pruning.wanda import Wanda

ONES = torch.ones(4)


def refine(weight, pruned, cycles=50, variance=ONES, **settings):
    """dsnot_refine_mask of one row with mu = 1 and ||X||^2 = 1 (so the Wanda score is |W|)."""
    mask = torch.tensor([pruned])
    return dsnot_refine_mask(torch.tensor([weight]), mask, ONES, ONES, variance, cycles, **settings)


def test_a_positive_error_grows_the_largest_pruned_effect_and_prunes_by_the_sign_rule():
    # pruned W_0 = 0.5, W_1 = -0.2: e = 0.3 > 0.1. Grow the largest W mu / var among all columns
    # (col 0); prune from the front of [negatives..., positives reversed] of the kept columns by
    # |W| (col 2: 1.0, col 3: 2.0, no negatives -> [3, 2]): col 3. e = 0.3 + 2.0 - 0.5 = 1.8
    # (no sign test by default, so the error may grow: the reference's rule).
    mask, cycles, swaps = refine([0.5, -0.2, 1.0, 2.0], [True, True, False, False], cycles=1)
    assert mask.tolist() == [[False, True, False, True]] and (cycles, swaps) == (1, 1)
    # cycle 2 (e = 1.8): grow the next largest (col 3, just pruned: 0 in the growth order), prune
    # the next from the front (col 2): e = 1.8 + 1.0 - 2.0 = 0.8
    mask, cycles, swaps = refine([0.5, -0.2, 1.0, 2.0], [True, True, False, False], cycles=2)
    assert mask.tolist() == [[False, True, True, False]] and (cycles, swaps) == (2, 2)


def test_a_negative_error_grows_the_most_negative_and_prunes_a_positive_from_the_back():
    # pruned W_0 = -0.5, W_1 = 0.2: e = -0.3. Grow col 0 (the smallest W mu / var); kept by |W|:
    # col 2 (-1.0), col 3 (2.0) -> [2 | 3]; e < 0 takes the back: col 3. e -> -0.3 + 2 + 0.5 = 2.2
    weight, pruned = [-0.5, 0.2, -1.0, 2.0], [True, True, False, False]
    mask, cycles, swaps = refine(weight, pruned, cycles=1)
    assert mask.tolist() == [[False, True, False, True]] and swaps == 1
    # the sign test (same_sign) refuses a swap that flips the error's sign: the row stops
    mask, cycles, swaps = refine(weight, pruned, same_sign=True)
    assert mask.tolist() == [pruned] and (cycles, swaps) == (1, 0)


def test_a_row_within_the_threshold_is_left_alone():
    mask, cycles, swaps = refine([0.5, -0.2, 1.0, 2.0], [True, True, False, False], update_threshold=0.5)
    assert mask.tolist() == [[True, True, False, False]] and (cycles, swaps) == (1, 0)


def test_growth_divides_by_the_input_variance_to_the_given_power():
    weight, pruned = [0.3, 0.4, 1.0, 2.0], [True, True, False, False]  # e = 0.7: grow the largest
    grown = lambda mask: [j for j in (0, 1) if not mask[0, j]]  # noqa: E731
    assert grown(refine(weight, pruned, cycles=1)[0]) == [1]  # 0.4 > 0.3
    low_variance = torch.tensor([0.1, 1.0, 1.0, 1.0])  # 0.3 / 0.1 = 3 > 0.4
    assert grown(refine(weight, pruned, cycles=1, variance=low_variance)[0]) == [0]
    assert grown(refine(weight, pruned, cycles=1, variance=low_variance, pow_of_var=0)[0]) == [1]


def test_the_prune_order_puts_negatives_first_and_positives_reversed_within_each_rows_length():
    values = torch.tensor([[1.0, 2.0, 0.0, 0.0],  # 2 kept, both positive: [1, 0]
                           [-1.0, 0.0, 3.0, 0.0]])  # 3 kept: negative, zero (-> position 0), positive
    assert sign_split_order(values, torch.tensor([[2], [3]])).tolist() == [[1, 0, 0, 0], [0, 0, 2, 0]]


def test_input_moments_follow_the_reference_per_sample_and_ignore_the_batch_size():
    torch.manual_seed(0)
    x = torch.randn(3, 5, 4)  # 3 samples of 5 tokens, 4 channels
    batched, single = InputMoments(4), InputMoments(4)
    batched.update(x.reshape(15, 4), 3)
    for sample in x:
        single.update(sample, 1)
    for name in ("sq_norm", "sum_mean", "variance"):
        assert torch.equal(getattr(batched, name), getattr(single, name)), name
    torch.testing.assert_close(single.sum_mean, x.sum(dim=1).mean(dim=0))  # mean over samples of sums
    torch.testing.assert_close(single.variance, x.var(dim=1, unbiased=False).mean(dim=0))  # equal T
    torch.testing.assert_close(single.sq_norm, (x * x).sum(dim=1).mean(dim=0))


def test_skipped_roles_keep_their_mask_and_the_work_is_reported():
    refinement = DSnoT()  # skip: mlp, the reference's --skip_layer
    moments = InputMoments(4)
    moments.update(torch.tensor([[1.0, 2.0, -1.0, 0.5], [0.0, 1.0, 1.0, 2.0]]), 1)
    weight = torch.tensor([[0.5, -0.2, 1.0, 2.0]])
    mask = torch.tensor([[True, True, False, False]])
    assert refinement.refine("layers.0.mlp.up_proj", "mlp_in", weight, mask, moments) is mask
    refinement.refine("layers.0.self_attn.q_proj", "attn_in", weight, mask, moments)
    details = refinement.details()
    assert list(details["per_linear"]) == ["layers.0.self_attn.q_proj"]
    assert details["per_layer"][0]["cycles"] >= 1 and details["skip"] == "mlp"


@pytest.mark.parametrize(("settings", "words"), [
    ({"max_cycles": 0}, "max_cycles"), ({"max_cycles": -3}, "max_cycles"), ({"max_cycles": 2.5}, "max_cycles"),
    ({"update_threshold": -0.1}, "update_threshold"), ({"skip": "attn"}, "skip"),
])
def test_bad_settings_are_one_line(settings, words):
    with pytest.raises(ConfigError, match=words) as err:
        DSnoT(**settings)
    assert "\n" not in str(err.value)


def test_a_refinement_needs_a_method_with_a_mask_it_can_follow():
    for method in ("depth", "dense"):
        with pytest.raises(ConfigError, match="refines a weight mask") as err:
            compose_config([f"pruning={method}", "pruning/refine=dsnot"])
        assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="select it with pruning/refine=dsnot"):
        compose_config(["pruning=wanda", "pruning.refine=dsnot"])
    Wanda(sparsity_type="2:4", refine=DSnoT())  # the reference's N:M loop: Wanda and magnitude
    with pytest.raises(ConfigError, match="2:4 masks of wanda or magnitude .*not of ria") as err:
        build(compose_config(["pruning=ria", "pruning.sparsity_type=2:4", "pruning/refine=dsnot"]).pruning,
              "pruning")
    assert "\n" not in str(err.value)
    for method in ("wanda", "ria", "sparsegpt", "magnitude"):
        built = build(compose_config([f"pruning={method}", "pruning/refine=dsnot"]).pruning, "pruning")
        assert isinstance(built.refine, DSnoT) and built.labels()["refine"] == "dsnot"
    assert build(compose_config(["pruning=wanda"]).pruning, "pruning").refine is None


@pytest.fixture
def llama(tiny_model_dirs):
    path = tiny_model_dirs["llama"]
    return AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)


@pytest.mark.parametrize("method", ["wanda", "sparsegpt", "magnitude", "ria"])
def test_the_api_refines_each_base_method_and_reports_the_work(llama, method):
    model, tokenizer = llama
    ids = torch.randint(0, VOCAB, (4, 16), generator=torch.Generator().manual_seed(0))
    report = prunelab.prune(model, tokenizer, method=method, refine="dsnot", sparsity=0.5, calibration=ids,
                            progress=False, overrides=["pruning.refine.skip=none"])
    assert report["labels"]["refine"] == "dsnot"
    work = report["pruning"]["refine"]
    assert work["per_layer"] and all(layer["cycles"] >= 1 for layer in work["per_layer"].values())
    assert abs(report["sparsity"]["overall"] - 0.5) < 0.02


def test_the_api_refuses_a_refinement_of_depth_pruning(llama):
    model, tokenizer = llama
    with pytest.raises(ConfigError, match="refines a weight mask"):
        prunelab.prune(model, tokenizer, method="depth", refine="dsnot", calibration=torch.zeros(2, 8).long())


def test_the_n_m_loop_swaps_inside_the_grown_weights_group_and_keeps_n_of_m():
    """One row, 2:4 over 8 inputs. Pruned: 0, 1 (group 0) and 4, 5 (group 1); their effects W mu sum
    to e = 1.0 + 0.5 + 0.25 - 2.0 = -0.25 < 0, so the most negative pruned effect (input 5) grows and
    the kept weight of lowest score in its group (input 7, score 0.1) is pruned: e = -0.25 + 2.0 +
    0.3 = 2.05, a sign flip, which stops the row (the N:M loop always tests the sign)."""
    weight = torch.tensor([[1.0, 0.5, 3.0, 4.0, 0.25, -2.0, 5.0, 0.3]])
    mask = torch.tensor([[True, True, False, False, True, True, False, False]])
    ones = torch.ones(8)
    score = torch.tensor([[9.0, 9.0, 9.0, 9.0, 9.0, 9.0, 1.0, 0.1]])
    refined, cycles, swaps = dsnot_refine_nm_mask(weight, mask, score, ones, ones, m=4, update_threshold=0.1)
    assert (refined == mask).all() and swaps == 0 and cycles == 1  # the flip: no swap
    weight[0, 7] = -1.8  # now e after = -0.25 + 2.0 - 1.8 = -0.05: same sign, |e| = 0.25 > 0.1 -> swap
    refined, cycles, swaps = dsnot_refine_nm_mask(weight, mask, score, ones, ones, m=4, update_threshold=0.1)
    assert refined[0, 5].item() is False and refined[0, 7].item() is True and swaps == 1
    # cycle 2: |e| = 0.05 stops the row, and, as in the reference, its grow candidate is written
    # "pruned": here the front pointer has run past the one negative pruned weight into the kept
    # weights (grow metric 0), so kept input 2 is pruned. Rows of real width never get there (50
    # cycles against ~in/4 pruned weights on each side).
    assert refined.tolist() == [[True, True, True, False, True, False, False, True]] and cycles == 2


def test_on_wide_rows_the_n_m_loop_keeps_n_of_every_m():
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(16, 512, generator=generator)  # [out, in]
    mean, variance = torch.randn(512, generator=generator), torch.rand(512, generator=generator) + 0.5
    score = weight.abs() * torch.rand(512, generator=generator)  # [out, in]
    groups = score.reshape(16, -1, 4)
    mask = torch.zeros_like(groups, dtype=torch.bool).scatter(2, groups.topk(2, dim=2, largest=False).indices, True)
    mask = mask.reshape(16, 512)
    refined, cycles, swaps = dsnot_refine_nm_mask(weight, mask, score, mean, variance, m=4, update_threshold=0.01)
    assert swaps > 0 and (refined != mask).any() and cycles <= 50
    assert (refined.reshape(16, -1, 4).sum(-1) == 2).all()
