"""SliceGPT (Ashkboos et al., ICLR 2024) on tiny models: rotation invariance, the sliced shapes and
parameter count, the PCA arithmetic by hand, bad input in one line, save and reload."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import prunelab
from prunelab.errors import ConfigError, UnsupportedModelError
from prunelab.models.adapter import ModelAdapter
from prunelab.models.slicing import fuse_norms, slicing_parameter_change
from prunelab.pruning.slicegpt import SliceGPT
from prunelab.scoring.slicegpt import pca_calc, random_orthogonal_upper_left, sliced_dimension

IDS = torch.randint(0, 300, (4, 32), generator=torch.Generator().manual_seed(0))


def load(tiny_model_dirs, arch: str = "llama"):
    directory = tiny_model_dirs[arch]
    return AutoModelForCausalLM.from_pretrained(directory).eval(), AutoTokenizer.from_pretrained(directory)


def test_pca_by_hand():
    X = torch.tensor([[[3.0, 0.0], [0.0, 1.0]]])  # [1, 2, 2]: H = diag(9, 1), damp 0.01 x 5
    values, vectors = pca_calc([X])
    torch.testing.assert_close(values, torch.tensor([9.05, 1.05], dtype=torch.float64))
    assert torch.equal(vectors.abs(), torch.eye(2, dtype=torch.float64))
    R = random_orthogonal_upper_left(4, 2, np.random.RandomState(0))
    torch.testing.assert_close(R.T @ R, torch.eye(4, dtype=torch.float64))
    assert torch.equal(R[2:, 2:], torch.eye(2, dtype=torch.float64)) and not R[:2, 2:].any()
    assert sliced_dimension(576, 0.25, 8) == 432 and sliced_dimension(100, 0.3, 8) == 64


@pytest.mark.parametrize("orientation", ("pca", "random"))
def test_rotation_without_slicing_keeps_the_function(tiny_model_dirs, monkeypatch, orientation):
    fused, _ = load(tiny_model_dirs)
    fuse_norms(ModelAdapter(fused))  # fusion alone changes the function (the embeddings' mean)
    model, tokenizer = load(tiny_model_dirs)
    monkeypatch.setattr(SliceGPT, "score", lambda self, ctx: ctx.loaded.adapter.hidden_size)  # slice nothing
    prunelab.prune(model, tokenizer, method="slicegpt", calibration=IDS, progress=False,
                   final_orientation=orientation)
    assert model.model.embed_tokens.weight.shape[1] == 32
    with torch.no_grad():
        torch.testing.assert_close(model(IDS).logits, fused(IDS).logits, atol=1e-4, rtol=1e-4)


def test_slicing_shapes_parameters_and_generation(tiny_model_dirs):
    model, tokenizer = load(tiny_model_dirs)  # hidden 32, 4 layers, vocabulary 320, tied head
    dense = sum(p.numel() for p in model.parameters())
    report = prunelab.prune(model, tokenizer, method="slicegpt", sparsity=0.25, calibration=IDS, progress=False)
    width = report["pruning"]["width"]
    assert width["sliced_dimension"] == 24  # int(0.75 x 32) = 24, a multiple of 8
    assert model.model.embed_tokens.weight.shape == (320, 24) and model.lm_head.weight.shape == (320, 32)
    layers = model.model.layers
    assert [layer.mlp.down_proj.out_features for layer in layers] == [24, 24, 24, 32]  # head unsliced
    assert layers[0].attn_shortcut_Q.shape == (24, 24) and layers[3].mlp_shortcut_Q.shape == (24, 32)
    pruned = sum(p.numel() for p in model.parameters())
    assert width["parameters_before"] == dense and width["parameters_after"] == pruned
    # embeddings 320 x 24, head 320 x 32; a layer: q 32x24, k/v 16x24, o 24x32, gate/up/down 3 x 64x24,
    # shortcuts 2 x 24x24 (the last: down 64x32, mlp shortcut 24x32); the norms have no weight left
    layer = 768 + 2 * 384 + 768 + 3 * 1536 + 2 * 576
    assert pruned == 320 * 24 + 320 * 32 + 3 * layer + layer + 512 + 192 == 50880
    assert report["parameters"]["pruned"]["total"] == pruned
    assert model.generate(IDS[:1, :4], max_new_tokens=3).shape == (1, 7)


def test_seeded_orientation_is_reproducible(tiny_model_dirs):
    weights = []
    for _ in range(2):
        model, tokenizer = load(tiny_model_dirs)
        prunelab.prune(model, tokenizer, method="slicegpt", sparsity=0.25, calibration=IDS, progress=False, seed=3)
        weights.append(model.model.layers[1].self_attn.q_proj.weight.clone())
    assert torch.equal(weights[0], weights[1])


@pytest.mark.parametrize(("options", "expected"), [({}, 16), ({"calibration_batch_size": None}, 3)])
def test_layers_see_the_references_batches_unless_told_otherwise(tiny_model_dirs, monkeypatch, options, expected):
    """The reference sums each PCA batch by batch (--cal-batch-size 16): its batches, not the
    run's runtime.calibration_batch_size (here 3), unless the setting is null."""
    import prunelab.pruning.slicegpt as slicegpt_module

    seen = []
    original = slicegpt_module.capture_layer_inputs

    def spy(adapter, samples, batch_size=1, *args, **kwargs):
        seen.append(batch_size)
        return original(adapter, samples, batch_size, *args, **kwargs)

    monkeypatch.setattr(slicegpt_module, "capture_layer_inputs", spy)
    model, tokenizer = load(tiny_model_dirs)
    prunelab.prune(model, tokenizer, method="slicegpt", calibration=IDS, progress=False, batch_size=3, **options)
    assert seen == [expected]


def test_save_and_reload_gives_the_same_logits(tiny_model_dirs, tmp_path):
    model, tokenizer = load(tiny_model_dirs)
    prunelab.prune(model, tokenizer, method="slicegpt", sparsity=0.25, calibration=IDS, progress=False)
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    loaded, _ = prunelab.load(str(tmp_path))
    with torch.no_grad():
        assert torch.equal(loaded(IDS).logits, model(IDS).logits)


@pytest.mark.parametrize(("options", "message"), [
    ({"sparsity": 0}, "fraction of the hidden dimension sliced"),
    ({"sparsity": 1.0}, "fraction of the hidden dimension sliced"),
    ({"sparsity": 1e-20, "round_interval": 1}, "slices nothing"),  # int((1 - 1e-20) x 32) = 32
    ({"sparsity": 0.9, "round_interval": 8}, "would keep no dimension"),
    ({"final_orientation": "svd"}, "final_orientation must be one of"),
    ({"calibration_batch_size": 0}, "calibration_batch_size must be a positive integer or null"),
])
def test_bad_settings_are_one_line_before_any_weight(tiny_model_dirs, options, message):
    model, tokenizer = load(tiny_model_dirs)
    before = [p.clone() for p in model.parameters()]
    with pytest.raises(ConfigError, match=message):
        prunelab.prune(model, tokenizer, method="slicegpt", calibration=IDS, progress=False, **options)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_unsupported_architecture_is_refused_before_any_weight(tiny_model_dirs):
    model, tokenizer = load(tiny_model_dirs, "gpt_neox")
    before = [p.clone() for p in model.parameters()]
    with pytest.raises(UnsupportedModelError, match="supported: llama, mistral, qwen2, qwen3"):
        prunelab.prune(model, tokenizer, method="slicegpt", calibration=IDS, progress=False)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


@pytest.mark.parametrize("arch", ("llama", "qwen2", "qwen3"))
def test_the_counted_change_is_the_sliced_models_count(tiny_model_dirs, arch):
    """`slicing_parameter_change` counts from the dense shapes what the rewrite really does."""
    for dim in (8, 16, 24):
        model, tokenizer = load(tiny_model_dirs, arch)
        change = slicing_parameter_change(ModelAdapter(model), dim)
        dense = sum(p.numel() for p in model.parameters())
        report = prunelab.prune(model, tokenizer, method="slicegpt", sparsity=1 - dim / 32, calibration=IDS,
                                progress=False)
        assert report["pruning"]["width"]["sliced_dimension"] == dim
        assert sum(p.numel() for p in model.parameters()) == dense + change


def test_a_parameter_budget_picks_the_dimension_nearest_to_it(tiny_model_dirs):
    model, tokenizer = load(tiny_model_dirs)
    adapter = ModelAdapter(model)
    dense = sum(p.numel() for p in model.parameters())
    removed = {d: -slicing_parameter_change(adapter, d) / dense for d in (8, 16, 24)}
    assert removed[8] > removed[16] > removed[24]  # fewer dimensions kept, fewer parameters
    target = round(removed[16] + 0.3 * (removed[8] - removed[16]), 4)  # nearer to 16's than to 8's
    report = prunelab.prune(model, tokenizer, method="slicegpt", params_removed=target, round_interval=8,
                            calibration=IDS, progress=False)
    width = report["pruning"]["width"]
    assert width["sliced_dimension"] == 16 and width["params_removed_target"] == target
    assert width["params_removed"] == pytest.approx(removed[16], abs=1e-12)


@pytest.mark.parametrize(("options", "message"), [
    ({"params_removed": 0}, "must be in \\(0, 1\\)"),
    ({"params_removed": 1.0}, "must be in \\(0, 1\\)"),
    ({"params_removed": 0.7}, "cannot remove 0.7 of this model's parameters"),
])
def test_a_budget_out_of_reach_is_one_line_before_any_weight(tiny_model_dirs, options, message):
    model, tokenizer = load(tiny_model_dirs)
    before = [p.clone() for p in model.parameters()]
    with pytest.raises(ConfigError, match=message):
        prunelab.prune(model, tokenizer, method="slicegpt", calibration=IDS, progress=False, **options)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
