"""Gemma 3 (`gemma3_text`) on the tiny fixed-init model of tests/tiny.py: what its adapter must know
(four norms per layer, q/k norms, (1 + weight) RMSNorms, scaled embeddings, sliding-window and
global layers), depth removal that keeps each layer's own attention type through a save and reload,
the method families that work on it (Wanda, SparseGPT, depth + Ghosted, FLAP with two key/value
heads) and the ones refused before any work, with one line (SliceGPT; width pruning with a single
key/value head, as Gemma-3-270M has). The architecture contract itself runs in the tests
parametrized over tiny.ARCHS."""

from __future__ import annotations

import pytest
import torch
from tiny import VOCAB, tiny_config, train_tokenizer
from transformers import AutoModelForCausalLM, AutoTokenizer

import prunelab
from prunelab.errors import ConfigError, UnsupportedModelError
from prunelab.models import ModelSpec, load_model
from prunelab.models.adapter import BY_LAYER_TYPE, ModelAdapter, layer_type_of

ARCH = "gemma3_text"
SLIDING, FULL = "sliding_attention", "full_attention"
IDS = torch.randint(0, VOCAB, (4, 24), generator=torch.Generator().manual_seed(0))  # longer than the window (6)


def loaded(tiny_model_dirs):
    return load_model(ModelSpec(name_or_path=str(tiny_model_dirs[ARCH]), device="cpu"))


def plain(tiny_model_dirs):
    directory = tiny_model_dirs[ARCH]
    return AutoModelForCausalLM.from_pretrained(directory).eval(), AutoTokenizer.from_pretrained(directory)


def logits(model, ids=IDS):
    with torch.no_grad():
        return model(input_ids=ids, use_cache=False).logits


def test_the_adapter_knows_the_four_norms_and_the_qk_norms(tiny_model_dirs):
    adapter = loaded(tiny_model_dirs).adapter
    layer = adapter.layers[0]
    attn_norm, mlp_norm = adapter.norms(layer)
    assert (attn_norm, mlp_norm) == (layer.input_layernorm, layer.pre_feedforward_layernorm)  # pre-norms
    assert adapter.post_norms(layer) == (layer.post_attention_layernorm, layer.post_feedforward_layernorm)
    assert adapter.qk_norms(layer) == (layer.self_attn.q_norm, layer.self_attn.k_norm)
    assert len({id(n) for n in adapter.all_norms(layer)}) == 6


def test_norm_gain_is_one_plus_weight_and_the_embeddings_are_scaled(tiny_model_dirs):
    adapter = loaded(tiny_model_dirs).adapter
    norm = adapter.post_norms(adapter.layers[1])[1]
    assert norm.weight.abs().max() > 0.05  # tiny.py perturbs the zero-initialised weights
    x = torch.randn(3, adapter.hidden_size, generator=torch.Generator().manual_seed(1))
    normalised = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + norm.eps)
    torch.testing.assert_close(norm(x), normalised * adapter.norm_gain(norm))
    assert adapter.embedding_scale == pytest.approx(adapter.hidden_size ** 0.5)
    embeddings = adapter.model.get_input_embeddings()
    with torch.no_grad():
        torch.testing.assert_close(embeddings(IDS), embeddings.weight[IDS] * adapter.embedding_scale)


def test_layers_of_both_types_get_their_own_kwargs(tiny_model_dirs):
    from prunelab.calibration import capture_layer_inputs

    adapter = loaded(tiny_model_dirs).adapter
    assert adapter.layer_types == [SLIDING, FULL, SLIDING, FULL]
    inputs = capture_layer_inputs(adapter, IDS, batch_size=2)
    by_type = inputs.kwargs[0][BY_LAYER_TYPE]
    assert set(by_type) == {SLIDING, FULL}
    cos_sliding, _ = by_type[SLIDING]["position_embeddings"]
    cos_full, _ = by_type[FULL]["position_embeddings"]
    assert not torch.allclose(cos_sliding, cos_full)  # rope theta 1e4 against 1e6
    assert all(p.device.type == "cpu" for p in adapter.model.parameters())
    assert "forward" not in vars(adapter.layers[0])  # the pass-through is undone


def test_removed_layers_keep_their_own_type_through_save_and_reload(tiny_model_dirs, tmp_path):
    model = loaded(tiny_model_dirs)
    adapter = model.adapter
    kept_layers = [adapter.layers[i] for i in (0, 2, 3)]
    adapter.remove_layers([1])  # a global layer between two sliding ones
    assert adapter.config.layer_types == [SLIDING, SLIDING, FULL] == [layer_type_of(l) for l in kept_layers]
    assert [l.self_attn.layer_idx for l in adapter.layers] == [0, 1, 2]
    assert [l.self_attn.sliding_window for l in adapter.layers] == [6, 6, None]
    expected = logits(model.model)
    model.model.save_pretrained(tmp_path)
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert reloaded.config.num_hidden_layers == 3 and reloaded.config.layer_types == [SLIDING, SLIDING, FULL]
    torch.testing.assert_close(logits(reloaded), expected)
    cached = reloaded.generate(IDS[:1, :10], max_new_tokens=6, do_sample=False, use_cache=True)
    uncached = reloaded.generate(IDS[:1, :10], max_new_tokens=6, do_sample=False, use_cache=False)
    assert torch.equal(cached, uncached)  # the sliding-window cache follows the sliced layer types


def test_a_layer_given_the_wrong_type_changes_the_logits(tiny_model_dirs):
    """What the type bookkeeping protects: the same weights run as the other type differ."""
    model = loaded(tiny_model_dirs).model
    expected = logits(model)
    model.config.layer_types = [FULL] * 4
    assert not torch.allclose(logits(model), expected)


@pytest.mark.parametrize("method", ["wanda", "sparsegpt"])
def test_unstructured_methods_prune_gemma(tiny_model_dirs, method):
    model, tokenizer = plain(tiny_model_dirs)
    report = prunelab.prune(model, tokenizer, method=method, sparsity=0.5, calibration=IDS, progress=False)
    assert report["sparsity"]["overall"] == pytest.approx(0.5, abs=0.01)
    assert torch.isfinite(logits(model)).all()


def test_depth_removal_with_ghosted_recovery_saves_and_reloads(tiny_model_dirs, tmp_path):
    model, tokenizer = plain(tiny_model_dirs)
    report = prunelab.prune(model, tokenizer, method="depth", scorer="block_influence", num_layers=1,
                            recovery="ghosted", calibration=IDS, progress=False)
    removed = report["pruning"]["removed_layers"]
    types = [SLIDING, FULL, SLIDING, FULL]
    assert len(removed) == 1 and model.config.layer_types == [t for i, t in enumerate(types) if i not in removed]
    expected = logits(model)
    from functools import partial

    from prunelab.models.boundary_operators import save_recovered
    from prunelab.recovery.plain_loading import save_for_plain_loading
    from prunelab.tracking.saved_model import save_model_folder

    save_model_folder(model, tokenizer, tmp_path / "model", partial(save_for_plain_loading, save=save_recovered))
    reloaded, _ = prunelab.load(str(tmp_path / "model"), device="cpu")
    assert reloaded.config.layer_types == model.config.layer_types
    torch.testing.assert_close(logits(reloaded), expected)


def test_flap_width_prunes_gemma_with_two_kv_heads_and_reloads(tiny_model_dirs, tmp_path):
    model, tokenizer = plain(tiny_model_dirs)
    dense = sum(p.numel() for p in model.parameters())
    report = prunelab.prune(model, tokenizer, method="flap", calibration=IDS, ratio=0.3, progress=False)
    assert sum(p.numel() for p in model.parameters()) < dense
    assert report["pruning"]["width"]["parameters_after"] < dense
    expected = logits(model)
    model.save_pretrained(tmp_path)
    reloaded = load_model(ModelSpec(name_or_path=str(tmp_path), device="cpu", tokenizer=str(tiny_model_dirs[ARCH])))
    torch.testing.assert_close(logits(reloaded.model), expected)


@pytest.fixture(scope="module")
def single_kv_gemma(tmp_path_factory):
    """Gemma-3-270M's attention shape in small: every query head shares one key/value head."""
    directory = tmp_path_factory.mktemp("gemma_mqa")
    config = tiny_config(ARCH)
    config.num_key_value_heads = 1
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(directory)
    train_tokenizer(directory)
    return directory


@pytest.mark.parametrize("method", ["flap", "wanda_sp", "magnitude_sp", "llm_pruner"])
@pytest.mark.parametrize("amount", [{"ratio": 0.05}, {"params_removed": 0.2}])
def test_width_pruning_with_a_single_kv_head_prunes_mlp_channels_only(single_kv_gemma, method, amount, caplog):
    """No attention unit can go (a layer must keep its one key/value head with its query heads):
    the methods prune MLP channels only, say so in one line, and the record says which."""
    model = AutoModelForCausalLM.from_pretrained(single_kv_gemma).eval()
    config = model.config
    dense = sum(p.numel() for p in model.parameters())
    layers = {"layer_start": 0, "layer_end": None} if method == "llm_pruner" else {}  # its default skips 4
    with caplog.at_level("WARNING"):
        report = prunelab.prune(model, AutoTokenizer.from_pretrained(single_kv_gemma), method=method,
                                calibration=IDS, progress=False, **amount, **layers)
    warned = [r.getMessage() for r in caplog.records if "single key/value head" in r.getMessage()]
    assert len(warned) == 1 and "\n" not in warned[0] and method in warned[0]
    width = report["pruning"]["width"]
    assert width["attention"].startswith("kept whole: a single key/value head")
    heads = {(layer["num_heads"], layer["num_kv_heads"]) for layer in width["per_layer"]}
    assert heads == {(config.num_attention_heads, 1)}
    assert all(layer.self_attn.q_proj.out_features == config.num_attention_heads * config.head_dim
               for layer in model.model.layers)
    channels = [layer["intermediate_size"] for layer in width["per_layer"]]
    assert max(channels) <= config.intermediate_size and sum(channels) < len(channels) * config.intermediate_size
    pruned = sum(p.numel() for p in model.parameters())
    assert width["params_removed"] == pytest.approx(1 - pruned / dense)
    if "params_removed" in amount:
        assert abs(width["params_removed"] - amount["params_removed"]) <= 0.01
    assert torch.isfinite(logits(model)).all()


def test_slicegpt_is_refused_on_gemma_in_one_line(tiny_model_dirs):
    model, tokenizer = plain(tiny_model_dirs)
    with pytest.raises(UnsupportedModelError, match="^slicegpt cannot prune .*gemma3_text.*post-norms") as err:
        prunelab.prune(model, tokenizer, method="slicegpt", calibration=IDS, progress=False)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("recovery", ["replaceme", "replaceme_cosine"])
def test_replaceme_is_refused_on_gemma_in_one_line(tiny_model_dirs, recovery):
    model, tokenizer = plain(tiny_model_dirs)
    with pytest.raises(UnsupportedModelError, match=f"^{recovery} cannot repair .*gemma3_text.*post-norm") as err:
        prunelab.prune(model, tokenizer, method="depth", scorer="block_influence", num_layers=1,
                       recovery=recovery, calibration=IDS, progress=False)
    assert "\n" not in str(err.value)


def test_why_replaceme_cannot_fold_on_gemma_a_scaled_mlp_output_projection_changes_nothing(tiny_model_dirs):
    """ReplaceMe folds T into down_proj; Gemma's post-feedforward norm renormalises each token, so even
    T = 2 I (which doubles the MLP's contribution on Llama) leaves what the MLP adds to the residual as
    it was, up to the norm's epsilon."""
    model, _ = plain(tiny_model_dirs)
    adapter = ModelAdapter(model)
    layer = adapter.layers[1]
    down_proj, mlp_post_norm = adapter.residual_writers(layer)[1], adapter.post_norms(layer)[1]
    mlp_post_norm.eps = 1e-12  # the tiny model's outputs are small enough for eps to matter
    seen = []
    hooks = [down_proj.register_forward_hook(lambda _m, _a, out: seen.append(("down", out))),
             mlp_post_norm.register_forward_hook(lambda _m, _a, out: seen.append(("joins", out)))]
    logits(model)
    with torch.no_grad():
        down_proj.weight.mul_(2.0)
    logits(model)
    for hook in hooks:
        hook.remove()
    (_, down), (_, joins), (_, down2), (_, joins2) = seen
    torch.testing.assert_close(down2, 2 * down, rtol=1e-5, atol=1e-6)   # the projection did double
    torch.testing.assert_close(joins2, joins, rtol=1e-4, atol=1e-5)     # what reaches the residual did not


@pytest.mark.parametrize("stage", [["pruning=slicegpt"], ["pruning=depth", "pruning.num_layers=1",
                                                          "pruning.protect_first=1", "recovery=replaceme"]])
def test_the_pipeline_refuses_before_the_dense_evaluation(tiny_model_dirs, text_file, tmp_path, monkeypatch, stage):
    from prunelab import pipeline

    monkeypatch.setattr(pipeline, "dense_metrics", lambda *a, **k: pytest.fail("the dense model was evaluated"))
    overrides = [f"model.name_or_path={tiny_model_dirs[ARCH]}", "model.device=cpu", "data=local_text",
                 f"data.calibration.paths=[{text_file}]", f"data.eval_paths=[{text_file}]",
                 "data.calibration.nsamples=4", "data.calibration.seqlen=16", "evaluation.perplexity.seqlen=32",
                 "tracking=none", "runtime.progress=false", *stage,
                 f"paths.records_dir={tmp_path / 'records'}", f"paths.cache_dir={tmp_path / 'cache'}"]
    with pytest.raises(UnsupportedModelError, match="^(slicegpt cannot prune|replaceme cannot repair)"):
        prunelab.run(overrides)


def test_a_ratio_and_a_parameter_budget_together_are_one_line(tiny_model_dirs):
    model, tokenizer = plain(tiny_model_dirs)
    with pytest.raises(ConfigError, match=r"^pruning.ratio=0.3 and pruning.params_removed=0.2 both set"):
        prunelab.prune(model, tokenizer, method="flap", calibration=IDS, ratio=0.3, params_removed=0.2)


def test_layer_by_layer_logits_follow_a_soft_capped_head(tiny_model_dirs):
    from prunelab.calibration import LayerSequentialRunner, capture_layer_inputs

    model = loaded(tiny_model_dirs)
    model.config.final_logit_softcapping = 0.5  # Gemma configs may cap the logits: tanh(z / c) x c
    inputs = capture_layer_inputs(model.adapter, IDS, batch_size=4)
    runner = LayerSequentialRunner(model.adapter, inputs, progress=False)
    for _ in runner:
        pass
    with torch.no_grad():
        actual = model.adapter.logits_from_hidden(torch.cat(runner.outputs.hidden))
    expected = logits(model.model)
    assert expected.abs().max() <= 0.5
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5)


def test_a_swapped_layer_order_runs_each_layer_as_its_own_type(tiny_model_dirs):
    """`layers_replaced` (probes, dense layers after depth pruning): the model hands masks and rotary
    embeddings out by `config.layer_types`, which must follow the layers' own types."""
    from prunelab.calibration import capture_layer_inputs

    adapter = loaded(tiny_model_dirs).adapter
    layers = list(adapter.layers)
    order = [layers[1], layers[0], layers[2], layers[3]]  # global, sliding, sliding, global
    inputs = capture_layer_inputs(adapter, IDS, batch_size=4)
    with torch.no_grad():
        hidden = inputs.hidden[0]
        for layer in order:
            hidden = adapter.call_layer(layer, hidden, inputs.kwargs[0])
        expected = adapter.logits_from_hidden(hidden)
        with adapter.layers_replaced(order):
            assert adapter.config.layer_types == [FULL, SLIDING, SLIDING, FULL]
            actual = logits(adapter.model)
    assert adapter.config.layer_types == [SLIDING, FULL, SLIDING, FULL]
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5)
