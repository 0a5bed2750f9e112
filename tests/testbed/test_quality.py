"""The shipped testbed models behave like capacity-bound LLMs (issue targets, measured by the code).

The fast test checks the direction of magnitude-pruning damage on a slice of the test split; the
slow tests (``make test-all``) re-measure each model card's targets in full with ``quality.evaluate``.
"""

import pytest

from prunelab.models import ModelSpec, load_model
from prunelab.testbed import quality


def _load(name: str):
    """The shipped model as every run loads it (testbed_pythia: its final checkpoint)."""
    loaded = load_model(ModelSpec(name, device="cpu"))
    return loaded.model, loaded.tokenizer


@pytest.mark.parametrize("name", ["testbed_llama", "testbed_pythia"])
def test_magnitude_pruning_damage_grows_with_sparsity(name):
    model, tokenizer = _load(name)
    windows = quality.test_windows(tokenizer, n_documents=60)
    dense = quality.perplexity(model, windows)
    half, most = (quality.perplexity(quality.magnitude_pruned(model, s), windows) for s in (0.5, 0.7))
    assert dense < half < most


@pytest.mark.slow
@pytest.mark.parametrize("name", ["testbed_llama", "testbed_pythia"])
def test_model_meets_the_testbed_quality_targets(name):
    model, tokenizer = _load(name)
    report = quality.evaluate(model, tokenizer)
    dense_zeroshot = sum(report["tasks"].values()) / len(report["tasks"])
    assert report["test_ppl"] <= report["unigram_ppl"] / 20
    assert report["magnitude_50"]["ppl_increase"] >= 0.10
    assert sum(report["magnitude_50"]["tasks"].values()) / len(report["tasks"]) < dense_zeroshot
    assert report["magnitude_70"]["ppl_increase"] >= 0.5
    removal = report["layer_removal_ppl_increase"]
    assert min(removal) < 0.02 and max(removal) > 0.5
    if name == "testbed_llama":  # graded like real benchmarks: easy and hard tasks, chance 50%
        accuracies = list(report["tasks"].values())
        assert sum(a >= 0.8 for a in accuracies) >= 4
        assert sum(0.55 <= a < 0.8 for a in accuracies) >= 2
