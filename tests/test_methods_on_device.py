"""Every method family once on each device (`device` fixture: the CPU here, CUDA on a GPU node with
`make test-gpu`): it runs where its model is, leaves every tensor there, and on CUDA gives what the
CPU gives (masks up to a few rounding-level flips, the same removed layers and kept units). The
families are `prunelab.gpu_check.families`, the list `prunelab-gpu-check` runs too."""

from __future__ import annotations

import copy

import pytest
import torch
from tiny import VOCAB
from transformers import AutoModelForCausalLM, AutoTokenizer

import prunelab
from prunelab.gpu_check.families import METHOD_FAMILIES as METHODS  # shared with prunelab-gpu-check


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
    shapes = [tuple(p.shape) for p in model.parameters()]
    assert shapes == [tuple(q.shape) for q in reference.parameters()], "width pruning kept other units than on the CPU"
    flips = sum(int(((p == 0).cpu() != (q == 0)).sum()) for p, q in zip(model.parameters(), reference.parameters()))
    total = sum(p.numel() for p in reference.parameters())
    assert flips <= 1e-3 * total, f"{flips} of {total} mask entries differ from the CPU run"
