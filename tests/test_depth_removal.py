"""Depth removal on every architecture: the pruned model saves, reloads and computes the same logits."""

from __future__ import annotations

import pytest
import torch
from tiny import ARCHS, VOCAB
from transformers import AutoModelForCausalLM

from prunelab.context import PruneContext
from prunelab.models import ModelSpec, load_model
from prunelab.pruning.depth import DepthPruning
from prunelab.pruning.report import parameter_counts
from prunelab.pruning.scorers.block_influence import BlockInfluence
from prunelab.pruning.scorers.random import RandomScorer


def ids() -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, 10), generator=torch.Generator().manual_seed(5))


def logits(model, tokens):
    with torch.no_grad():
        return model(input_ids=tokens, use_cache=False).logits


@pytest.mark.parametrize("arch", ARCHS)
def test_removed_layers_save_and_reload_with_identical_logits(arch, tiny_model_dirs, tmp_path):
    loaded = load_model(ModelSpec(name_or_path=str(tiny_model_dirs[arch]), device="cpu"))
    dense_params = parameter_counts(loaded.adapter)
    ctx = PruneContext(loaded, seed=1, calibration=ids, progress=False)
    method = DepthPruning(RandomScorer(), num_layers=2)
    report = method.prune(ctx, method.score(ctx))
    assert len(report.removed_layers) == 2 and len(report.dense_layers) == 4
    pruned_params = parameter_counts(loaded.adapter)
    assert pruned_params["decoder_layers"] == 2 and pruned_params["total"] < dense_params["total"]
    assert report.details["layers_after"] == 2 and len(report.details["layer_scores"]) == 4
    expected = logits(loaded.model, ids())
    loaded.model.save_pretrained(tmp_path, safe_serialization=True)
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert reloaded.config.num_hidden_layers == 2
    assert sum(p.numel() for p in reloaded.parameters()) == pruned_params["total"]
    torch.testing.assert_close(logits(reloaded, ids()), expected)


def test_removing_zero_layers_changes_nothing(tiny_model_dirs):
    loaded = load_model(ModelSpec(name_or_path=str(tiny_model_dirs["llama"]), device="cpu"))
    before = logits(loaded.model, ids())
    ctx = PruneContext(loaded, seed=0, calibration=ids, progress=False)
    method = DepthPruning(BlockInfluence(), num_layers=0)
    report = method.prune(ctx, method.score(ctx))
    assert report.removed_layers == [] and loaded.adapter.num_layers == 4
    assert torch.equal(logits(loaded.model, ids()), before)


@pytest.mark.parametrize("target", [0.2, 0.45])
def test_a_parameter_budget_sets_the_number_of_layers_removed(tiny_model_dirs, target):
    """`params_removed` (the budget width pruning takes) picks the layer count whose removal comes
    nearest to that fraction of every parameter, embeddings and head included."""
    loaded = load_model(ModelSpec(name_or_path=str(tiny_model_dirs["llama"]), device="cpu"))
    dense = parameter_counts(loaded.adapter)["total"]
    per_layer = sum(p.numel() for p in loaded.adapter.layers[0].parameters())
    method = DepthPruning(BlockInfluence(), params_removed=target)
    ctx = PruneContext(loaded, 0, ids, progress=False)
    report = method.prune(ctx, method.score(ctx))
    removed = len(report.removed_layers)
    achieved = 1 - parameter_counts(loaded.adapter)["total"] / dense
    assert report.details["params_removed"] == pytest.approx(achieved)
    assert removed == round(target * dense / per_layer)  # nearest, not floored
    assert abs(achieved - target) <= per_layer / dense / 2 + 1e-9
    assert method.labels()["params_removed"] == target and method.labels()["layers_removed"] is None


@pytest.mark.parametrize("target", [0, 1, 1.5, -0.1])
def test_a_parameter_budget_outside_zero_one_is_one_line(target):
    from prunelab.errors import ConfigError

    with pytest.raises(ConfigError, match=r"must be in \(0, 1\)"):
        DepthPruning(BlockInfluence(), params_removed=target)
