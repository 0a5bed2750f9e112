"""FLAP, Wanda-sp and magnitude-sp on tiny models: the selection math by hand, the parameter
budget, grouped-query units, bad input in one line, the record. Faithfulness to the reference is
tests/test_faithful_width.py."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import prunelab
from prunelab.errors import ConfigError, UnsupportedModelError
from prunelab.pruning.parameter_budget import layers_for_fraction, uniform_counts
from prunelab.scoring.width import adaptive_keep, adaptive_unit_scores, uniform_keep

METHODS = ("flap", "wanda_sp", "magnitude_sp")
IDS = torch.randint(0, 300, (4, 32), generator=torch.Generator().manual_seed(0))


def load(tiny_model_dirs, arch: str = "llama"):
    directory = tiny_model_dirs[arch]
    return AutoModelForCausalLM.from_pretrained(directory).eval(), AutoTokenizer.from_pretrained(directory)


def test_uniform_rule_keeps_ties_at_the_threshold():
    scores = torch.tensor([3.0, 1.0, 2.0, 1.0, 5.0])
    # int(0.4 x 5) = 2 to remove: threshold = sorted[2] = 2 -> keep 3, 2, 5 (the two 1s go)
    assert uniform_keep(scores, 2).tolist() == [True, False, True, False, True]
    # threshold sorted[1] = 1: both tied 1s are kept, nothing goes
    assert uniform_keep(scores, 1).all()


def test_adaptive_selection_by_hand():
    attn = torch.tensor([[0.0, 1.0, 2.0, 3.0]])  # one layer, 2 heads of head_dim 2
    mlp = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    heads, channels = adaptive_unit_scores(attn, mlp, 2)
    # standardised over each row: both rows become (-1.16, -0.39, 0.39, 1.16); heads average pairs
    torch.testing.assert_close(heads, torch.tensor([[-0.7746, 0.7746]]), atol=1e-4, rtol=0)
    # costs: head 3, channel 1; total 10, keep 10 x 0.5 = 5. Descending: c3 1.16, h1 0.77, c2 0.39,
    # c1 -0.39, h0 -0.77, c0 -1.16 -> cumulative 1, 4, 5, ... nearest 5 at c2: keep above 0.39
    keep_heads, keep_channels = adaptive_keep(heads, channels, 3, 1, ratio=0.5)
    assert keep_heads.tolist() == [[False, True]] and keep_channels.tolist() == [[False, False, False, True]]


def test_budget_arithmetic():
    # 2 layers of 4 units x 10 and 8 channels x 1 = 96; 30% of 200 = 60: heads floor(60/96 x 4) = 2
    # per layer (40), channels round(20 / 2) = 10 -> more than 8: one line
    with pytest.raises(ConfigError, match="every MLP channel"):
        uniform_counts(200, 0.3, 2, (10, 1), (4, 8))
    assert uniform_counts(200, 0.25, 2, (10, 1), (4, 16)) == (1, 15)  # 50: 2 heads x 10, 30 channels / 2
    assert layers_for_fraction([10, 10, 10, 10], 100, 0.25) == 2  # 25 params: 2.5 layers -> 2
    assert layers_for_fraction([10, 10, 10, 10], 100, 0.26) == 3


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("target", (0.25,))
def test_parameter_budget_is_met_within_one_percent(tiny_model_dirs, method, target):
    model, tokenizer = load(tiny_model_dirs)
    dense = sum(p.numel() for p in model.parameters())
    report = prunelab.prune(model, tokenizer, method=method, calibration=IDS, params_removed=target,
                            progress=False)
    width = report["pruning"]["width"]
    pruned = sum(p.numel() for p in model.parameters())
    assert width["parameters_before"] == dense and width["parameters_after"] == pruned
    assert width["params_removed"] == pytest.approx(1 - pruned / dense)
    assert abs(width["params_removed"] - target) <= 0.01
    assert report["parameters"]["pruned"]["total"] == pruned
    assert [layer["parameters_after"] for layer in width["per_layer"]] == \
        [sum(p.numel() for p in layer.parameters()) for layer in model.model.layers]
    assert model.generate(IDS[:1, :4], max_new_tokens=3).shape == (1, 7)


def test_grouped_query_units_are_whole_groups(tiny_model_dirs):
    model, tokenizer = load(tiny_model_dirs)  # 4 query heads over 2 key/value heads
    report = prunelab.prune(model, tokenizer, method="flap", calibration=IDS, ratio=0.3, progress=False)
    for layer in report["pruning"]["width"]["per_layer"]:
        assert layer["num_heads"] == 2 * layer["num_kv_heads"] == 2 * len(layer["kv_heads"])
    assert any(layer["num_kv_heads"] < 2 for layer in report["pruning"]["width"]["per_layer"])
    biases = [layer.self_attn.o_proj.bias for layer in model.model.layers]
    assert all(b is not None for b in biases)  # every layer gets FLAP's bias
    model(IDS)


@pytest.mark.parametrize(("options", "message"), [
    ({"ratio": 0}, "pruning.ratio must be in"),
    ({"ratio": 1.0}, "pruning.ratio must be in"),
    ({"params_removed": 1.0}, "params_removed is the fraction"),
    ({"params_removed": 0.0}, "params_removed is the fraction"),
    ({"structure": "UL-MM"}, "pruning.structure must be one of"),
])
def test_bad_settings_are_one_line_before_any_weight(tiny_model_dirs, options, message):
    model, tokenizer = load(tiny_model_dirs)
    before = [p.clone() for p in model.parameters()]
    with pytest.raises(ConfigError, match=message):
        prunelab.prune(model, tokenizer, method="flap", calibration=IDS, progress=False, **options)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


@pytest.mark.parametrize("method", METHODS)
def test_unsupported_architecture_is_refused_before_any_weight(tiny_model_dirs, method):
    model, tokenizer = load(tiny_model_dirs, "gpt_neox")
    before = [p.clone() for p in model.parameters()]
    with pytest.raises(UnsupportedModelError, match="supported: gemma3_text, llama, mistral, qwen2, qwen3"):
        prunelab.prune(model, tokenizer, method=method, calibration=IDS, progress=False)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_flap_refuses_a_layer_losing_every_head(tiny_model_dirs):
    model, tokenizer = load(tiny_model_dirs)
    before = [p.clone() for p in model.parameters()]
    with pytest.raises(ConfigError, match="FLAP would remove every"):
        prunelab.prune(model, tokenizer, method="flap", calibration=IDS, ratio=0.95, progress=False)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_streamed_runs_are_refused_in_one_line():
    from types import SimpleNamespace

    from prunelab.pipeline import check_streamable
    from prunelab.pruning.wanda_sp import WandaSP

    setup = SimpleNamespace(pruning=WandaSP(), recovery=SimpleNamespace(name="none"))
    with pytest.raises(ConfigError, match="cannot yet run pruning=wanda_sp"):
        check_streamable(setup)


@pytest.mark.parametrize("method,key,default", [("flap", "ratio", 0.2), ("wanda_sp", "ratio", 0.2),
                                                ("llm_pruner", "ratio", 0.25), ("slicegpt", "sparsity", 0.25)])
def test_a_null_ratio_keeps_the_signature_of_records_written_with_the_default(method, key, default):
    """The YAML default became null (so that a ratio and a budget together can be refused): runs
    keep the signatures of the records written when it was spelled out."""
    import copy

    from prunelab.config import compose_config, resolved
    from prunelab.tracking.record import config_signature

    new = resolved(compose_config([f"pruning={method}"]))
    assert new["pruning"][key] is None
    old = copy.deepcopy(new)
    old["pruning"][key] = default
    assert config_signature(new) == config_signature(old)
    budget_new, budget_old = copy.deepcopy(new), copy.deepcopy(old)
    budget_new["pruning"]["params_removed"] = budget_old["pruning"]["params_removed"] = 0.2
    assert config_signature(budget_new) == config_signature(budget_old) != config_signature(new)
    other = copy.deepcopy(new)
    other["pruning"][key] = 0.3
    assert config_signature(other) != config_signature(new)


@pytest.mark.parametrize("method,key", [("flap", "ratio"), ("wanda_sp", "ratio"), ("magnitude_sp", "ratio"),
                                        ("llm_pruner", "ratio"), ("slicegpt", "sparsity")])
def test_an_amount_and_a_parameter_budget_together_are_one_line(tiny_model_dirs, method, key):
    model, tokenizer = load(tiny_model_dirs)
    with pytest.raises(ConfigError, match=rf"^pruning.{key}=0.3 and pruning.params_removed=0.2 both set the "
                                          r"amount to prune: set one \(the other null\)$"):
        prunelab.prune(model, tokenizer, method=method, calibration=IDS, params_removed=0.2, **{key: 0.3})
