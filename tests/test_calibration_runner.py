"""The layer-sequential runner: statistics hooks, propagation switch, and its memory bound."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
from tiny import VOCAB

from prunelab.calibration import (
    LayerSequentialRunner, SquaredColumnNorm, capture_layer_inputs, collect_linear_inputs,
)
from prunelab.models import ModelSpec, load_model


@pytest.fixture()
def llama(tiny_model_dirs):
    return load_model(ModelSpec(name_or_path=str(tiny_model_dirs["llama"]), device="cpu"))


def samples(n=4, t=12):
    return torch.randint(0, VOCAB, (n, t), generator=torch.Generator().manual_seed(3))


def test_captured_kwargs_include_rotary_embeddings(llama):
    inputs = capture_layer_inputs(llama.adapter, samples(), batch_size=2)
    assert len(inputs.hidden) == 2 and inputs.hidden[0].shape == (2, 12, 32)
    assert "position_embeddings" in inputs.kwargs[0]


def test_squared_column_norm_is_a_running_mean_over_samples(llama):
    adapter = llama.adapter
    inputs = capture_layer_inputs(adapter, samples(), batch_size=2)
    step = next(iter(LayerSequentialRunner(adapter, inputs, progress=False)))
    q_proj = adapter.linears(step.layer)["self_attn.q_proj"]
    seen = []
    handle = q_proj.register_forward_hook(lambda m, a, o: seen.append(a[0].detach()))
    with collect_linear_inputs({"q": q_proj}, SquaredColumnNorm) as stats:
        step.forward()
    handle.remove()
    x = torch.cat(seen)  # [4, 12, 32]
    expected = (x.float() ** 2).sum(dim=1).mean(dim=0)  # per sample sum over tokens, mean over samples
    torch.testing.assert_close(stats["q"].value, expected)


def test_dense_propagation_ignores_changes_made_after_the_first_forward(llama):
    ids = samples()
    with torch.no_grad():
        dense_logits = llama.model(input_ids=ids, use_cache=False).logits
    inputs = capture_layer_inputs(llama.adapter, ids)
    runner = LayerSequentialRunner(llama.adapter, inputs, propagate="dense", progress=False)
    for step in runner:
        step.forward()
        for linear in llama.adapter.linears(step.layer).values():
            linear.weight.data.mul_(0.5)  # a change the dense stream must not see
    out = llama.adapter.logits_from_hidden(torch.cat(runner.outputs.hidden))
    torch.testing.assert_close(out, dense_logits, atol=1e-5, rtol=1e-5)


def test_only_two_activation_buffers_are_alive(llama):
    inputs = capture_layer_inputs(llama.adapter, samples())
    refs = []
    runner = LayerSequentialRunner(llama.adapter, inputs, progress=False)
    del inputs
    for step in runner:
        refs.append([weakref.ref(h) for h in step.inputs.hidden])
        gc.collect()
        alive = [i for i, r in enumerate(refs) if any(x() is not None for x in r)]
        assert alive == [step.index], f"inputs of layers {alive} still held at layer {step.index}"
