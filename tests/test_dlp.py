"""DLP allocation (pruning/allocation=dlp): its mapping from layer scores to sparsities on hand-checked
numbers, its one-line errors and a run through the API; the official ratios on SmolLM2-135M are
compared in experiments/benchmarks/official_dlp.py."""

from __future__ import annotations

import pytest
import torch
from tiny import VOCAB
from transformers import AutoModelForCausalLM, AutoTokenizer

import prunelab
from prunelab.allocation.dlp import DLP, dlp_sparsities, layer_score
from prunelab.errors import ConfigError


def scores(*values: float) -> list[torch.Tensor]:
    return [torch.tensor(v, dtype=torch.float32) for v in values]


def test_a_higher_layer_score_gets_a_higher_sparsity_in_a_band_of_two_alpha():
    # I = 1, 2, 3 (sum 6): r = 5/6, 4/6, 3/6 -> scaled to [0, 0.3]: 0.3, 0.15, 0 -> minus the mean
    # (0.15) plus 1 - 0.5: densities 0.65, 0.5, 0.35 -> sparsities 0.35, 0.5, 0.65
    got = dlp_sparsities(scores(1.0, 2.0, 3.0), 0.5, 0.15)
    assert got == pytest.approx([0.35, 0.5, 0.65], abs=1e-6)


def test_a_layer_at_or_below_zero_gets_the_references_floor():
    # densities 1.05, 0.9, 0.75 at target 0.1: the first layer's sparsity -0.05 becomes 0.01
    got = dlp_sparsities(scores(1.0, 2.0, 3.0), 0.1, 0.15)
    assert got[0] == 0.01 and got[1:] == pytest.approx([0.1, 0.25], abs=1e-6)


def test_the_layer_score_is_the_mean_over_all_linears_entries_together():
    big, small = torch.full((4, 4), 1.0), torch.full((1, 2), 4.0)  # 16 x 1 and 2 x 4
    assert float(layer_score([big, small])) == pytest.approx((16 + 8) / 18)  # not (1 + 4) / 2


def test_bad_alpha_and_too_high_a_layer_are_one_line():
    for alpha in (-0.1, 1.0):
        with pytest.raises(ConfigError, match="alpha"):
            DLP(alpha=alpha)

    class Stats:  # three layers whose scores put the last one above 1 at target 0.9
        def role_weights(self):
            return iter([{"attn_in": [torch.full((2, 2), float(v))]} for v in (1, 2, 3)])

        def squared_input_norms(self):
            return [{"attn_in": torch.ones(2)} for _ in range(3)]

    with pytest.raises(ConfigError, match="dlp allocation gives layer sparsities >= 1") as err:
        DLP(alpha=0.15).allocate(0.9, Stats())
    assert "\n" not in str(err.value)


@pytest.fixture
def llama(tiny_model_dirs):
    path = tiny_model_dirs["llama"]
    return AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)


def test_the_api_prunes_with_dlp_targets(llama):
    model, tokenizer = llama
    ids = torch.randint(0, VOCAB, (4, 16), generator=torch.Generator().manual_seed(0))
    report = prunelab.prune(model, tokenizer, method="wanda", allocation="dlp", sparsity=0.5, calibration=ids,
                            progress=False)
    allocation = report["pruning"]["allocation"]
    assert allocation["policy"] == "dlp" and len(allocation["layer_scores"]) == model.config.num_hidden_layers
    targets = allocation["layer_targets"]
    assert max(targets) - min(targets) == pytest.approx(0.3, abs=1e-6)  # the band is 2 alpha wide
    assert sum(targets) / len(targets) == pytest.approx(0.5, abs=1e-6)
