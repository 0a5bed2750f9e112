"""Every method family once on each device (`device` fixture: the CPU here, CUDA on a GPU node with
`make test-gpu`): it runs where its model is, leaves every tensor there, and on CUDA gives what the
CPU gives (masks up to a few rounding-level flips, the same removed layers)."""

from __future__ import annotations

import copy

import pytest
import torch
from tiny import VOCAB
from transformers import AutoModelForCausalLM, AutoTokenizer

import prunelab

METHODS = {  # family -> prunelab.prune keywords
    "magnitude 2:4": dict(method="magnitude", sparsity=0.5, sparsity_type="2:4"),
    "wanda": dict(method="wanda", sparsity=0.5),
    "sparsegpt": dict(method="sparsegpt", sparsity=0.5),
    "wanda + owl": dict(method="wanda", sparsity=0.5, allocation="owl"),
    "wanda + pals": dict(method="wanda", sparsity=0.5, allocation="pals"),
    "wanda + alpha": dict(method="wanda", sparsity=0.5, allocation="alpha"),
    "wanda + gradient": dict(method="wanda", sparsity=0.5, allocation="gradient"),
    "depth: block influence + ghosted": dict(method="depth", scorer="block_influence", num_layers=1,
                                             recovery="ghosted"),
    "depth: sleb": dict(method="depth", scorer="sleb", num_layers=1),
    "depth: angular + replaceme": dict(method="depth", scorer="angular", num_layers=1, recovery="replaceme",
                                        protect_first=1),
    "depth: wrp + linear_patch_r": dict(method="depth", scorer="wrp", num_layers=1, recovery="linear_patch_r"),
}


def pruned(path, device: torch.device, options: dict):
    model = AutoModelForCausalLM.from_pretrained(path).to(device).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    ids = torch.randint(0, VOCAB, (4, 16), generator=torch.Generator().manual_seed(0))  # [N, T]
    report = prunelab.prune(model, tokenizer, calibration=ids, progress=False, **copy.deepcopy(options))
    return model, report


@pytest.mark.parametrize("family", list(METHODS))
def test_each_method_family_runs_on_the_device_of_its_model(family, device, tiny_model_dirs):
    model, report = pruned(tiny_model_dirs["llama"], device, METHODS[family])
    assert {p.device.type for p in model.parameters()} == {device.type}
    with torch.no_grad():
        logits = model(input_ids=torch.randint(0, VOCAB, (1, 8), device=device)).logits  # [1, 8, V]
    assert torch.isfinite(logits).all()
    if device.type == "cpu":
        return
    reference, expected = pruned(tiny_model_dirs["llama"], torch.device("cpu"), METHODS[family])
    assert report["pruning"].get("removed_layers") == expected["pruning"].get("removed_layers")
    flips = sum(int(((p == 0).cpu() != (q == 0)).sum()) for p, q in zip(model.parameters(), reference.parameters()))
    total = sum(p.numel() for p in reference.parameters())
    assert flips <= 1e-3 * total, f"{flips} of {total} mask entries differ from the CPU run"
