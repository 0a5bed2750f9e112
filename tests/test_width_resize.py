"""models.width: heads (with their key/value group) and MLP channels cut from the Linear modules.

A resized layer must compute exactly what the dense layer computes with the removed units' outputs
zeroed (the masked model), run `generate` with a KV cache, save and rebuild from its config, and a
grouped-query model's multi-head rewrite must give identical logits.
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from prunelab.errors import ConfigError, UnsupportedModelError
from prunelab.models.adapter import ModelAdapter
from prunelab.models.width import (SHAPES_KEY, apply_layer_shapes, layer_width, resize_layer,
                                   to_multi_head)

IDS = torch.tensor([[5, 17, 42, 9, 100, 3, 77, 12]])
RESIZABLE = ("llama", "mistral", "qwen2", "qwen3")


def load(tiny_model_dirs, arch: str):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dirs[arch], dtype=torch.float32).eval()
    return model, ModelAdapter(model)


@torch.no_grad()
def masked_logits(model, adapter, index: int, kv_heads: list[int], channels: list[int]) -> torch.Tensor:
    """Logits of the dense model with every other head's o_proj columns and every other channel's
    down_proj columns zeroed: what the resized layer must reproduce."""
    layer = adapter.layers[index]
    width = layer_width(adapter, layer)
    o, down = adapter.residual_writers(layer)
    saved = o.weight.clone(), down.weight.clone()
    per_group = width.group_size * width.head_dim
    head_mask = torch.zeros(width.num_kv_heads, per_group, dtype=torch.bool)
    head_mask[kv_heads] = True
    channel_mask = torch.zeros(width.intermediate_size, dtype=torch.bool)
    channel_mask[channels] = True
    o.weight *= head_mask.reshape(1, -1)
    down.weight *= channel_mask.reshape(1, -1)
    logits = model(IDS).logits
    o.weight.copy_(saved[0])
    down.weight.copy_(saved[1])
    return logits


@pytest.mark.parametrize("arch", RESIZABLE)
def test_resized_layer_equals_the_masked_dense_layer(tiny_model_dirs, arch):
    model, adapter = load(tiny_model_dirs, arch)
    expected = masked_logits(model, adapter, 1, [1], [0, 5, 63])
    params = sum(p.numel() for p in model.parameters())
    resize_layer(adapter, 1, kv_heads=[1], channels=[63, 0, 5])  # order and duplicates do not matter
    width = layer_width(adapter, adapter.layers[1])
    assert (width.num_heads, width.num_kv_heads, width.intermediate_size) == (2, 1, 3)
    torch.testing.assert_close(model(IDS).logits, expected, rtol=0, atol=1e-5)
    assert sum(p.numel() for p in model.parameters()) < params
    shapes = getattr(model.config, SHAPES_KEY)
    assert shapes[1] == {"num_attention_heads": 2, "num_key_value_heads": 1, "intermediate_size": 3,
                         "attn_out_bias": False, "mlp_out_bias": False}
    assert shapes[0]["num_attention_heads"] == model.config.num_attention_heads


def test_generate_with_kv_cache_after_resizing(tiny_model_dirs):
    model, adapter = load(tiny_model_dirs, "llama")
    resize_layer(adapter, 0, kv_heads=[0], channels=list(range(10)))
    resize_layer(adapter, 2, channels=list(range(40)))
    cached = model.generate(IDS, max_new_tokens=6, do_sample=False, use_cache=True)
    uncached = model.generate(IDS, max_new_tokens=6, do_sample=False, use_cache=False)
    assert cached.shape == (1, IDS.shape[1] + 6) and torch.equal(cached, uncached)


def test_bias_is_added_and_the_checkpoint_rebuilds_from_its_config(tiny_model_dirs, tmp_path):
    model, adapter = load(tiny_model_dirs, "qwen2")
    hidden = model.config.hidden_size
    resize_layer(adapter, 0, kv_heads=[0], channels=[1, 2], attn_out_bias=torch.full((hidden,), 0.5))
    resize_layer(adapter, 3, channels=[4], mlp_out_bias=torch.arange(hidden, dtype=torch.float32))
    o, down = adapter.residual_writers(adapter.layers[3])
    assert o.bias is None and torch.equal(down.bias, torch.arange(hidden, dtype=torch.float32))
    expected = model(IDS).logits
    model.save_pretrained(tmp_path)

    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(tmp_path)
    assert getattr(config, SHAPES_KEY)[0]["attn_out_bias"] is True
    rebuilt = AutoModelForCausalLM.from_config(config).eval()
    assert apply_layer_shapes(ModelAdapter(rebuilt))
    from safetensors.torch import load_file

    missing, unexpected = rebuilt.load_state_dict(load_file(tmp_path / "model.safetensors"), strict=False)
    assert not unexpected and all("lm_head" in key for key in missing)  # the tied head
    rebuilt.tie_weights()
    torch.testing.assert_close(rebuilt(IDS).logits, expected, rtol=0, atol=0)


@pytest.mark.parametrize("arch", ("llama", "qwen3"))
def test_multi_head_rewrite_gives_identical_logits(tiny_model_dirs, arch):
    model, adapter = load(tiny_model_dirs, arch)
    expected = model(IDS).logits
    to_multi_head(adapter)
    width = layer_width(adapter, adapter.layers[0])
    assert width.num_kv_heads == width.num_heads and model.config.num_key_value_heads == width.num_heads
    assert torch.equal(model(IDS).logits, expected)
    resize_layer(adapter, 0, kv_heads=[0, 3])  # now a single query head can go
    assert layer_width(adapter, adapter.layers[0]).num_heads == 2
    model(IDS)


def test_removing_every_head_or_an_unsupported_architecture_is_one_line(tiny_model_dirs):
    model, adapter = load(tiny_model_dirs, "llama")
    before = [p.clone() for p in adapter.layers[0].parameters()]
    with pytest.raises(ConfigError, match="layer 0 would keep no attention head"):
        resize_layer(adapter, 0, kv_heads=[])
    assert all(torch.equal(a, b) for a, b in zip(before, adapter.layers[0].parameters()))
    _, neox = load(tiny_model_dirs, "gpt_neox")
    with pytest.raises(UnsupportedModelError, match="supported: gemma3_text, llama, mistral, qwen2, qwen3"):
        resize_layer(neox, 0, channels=[0])


def test_removing_layers_keeps_the_stored_shapes_aligned(tiny_model_dirs):
    model, adapter = load(tiny_model_dirs, "llama")
    resize_layer(adapter, 2, channels=[0, 1, 2])
    adapter.remove_layers([0])
    assert [s["intermediate_size"] for s in getattr(model.config, SHAPES_KEY)] == [64, 3, 64]
