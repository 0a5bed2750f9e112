"""A model loaded with `device_map="auto"` and a `max_memory` that puts its weights on disk
(accelerate keeps them on `meta` between calls): the checks read them, the counts count them, and
the layer-by-layer passes prune them, with the same result as the model in memory. A method that
cannot work on offloaded weights is refused in one line before any weight is touched."""

from __future__ import annotations

import copy

import pytest
import torch
from tiny import VOCAB
from transformers import AutoModelForCausalLM, AutoTokenizer

import prunelab
from prunelab.errors import ConfigError, ModelCheckError
from prunelab.models import wrap_model
from prunelab.models.checks import check_finite
from prunelab.models.offloaded_weights import has_offloaded_weights, named_weights, onloaded
from prunelab.pruning.report import parameter_counts

ON_OFFLOADED = {  # family -> prunelab.prune keywords, each run on disk-offloaded weights
    "magnitude": dict(method="magnitude", sparsity=0.5),
    "magnitude 2:4": dict(method="magnitude", sparsity=0.5, sparsity_type="2:4"),
    "wanda": dict(method="wanda", sparsity=0.5),
    "sparsegpt": dict(method="sparsegpt", sparsity=0.5),
    "ria": dict(method="ria", sparsity=0.5),
    "wanda + dsnot": dict(method="wanda", sparsity=0.5, refine="dsnot"),
    "wanda + owl": dict(method="wanda", sparsity=0.5, allocation="owl"),
    "depth: block influence": dict(method="depth", scorer="block_influence", num_layers=1),
    "depth: angular": dict(method="depth", scorer="angular", num_layers=1),
    "depth: sleb": dict(method="depth", scorer="sleb", num_layers=2),  # its candidates' full forwards
}
REFUSED = {  # family -> what the one line names
    "wanda + gradient": (dict(method="wanda", sparsity=0.5, allocation="gradient"), "pruning/allocation=gradient"),
    "depth: shortened_taylor": (dict(method="depth", scorer="shortened_taylor", num_layers=1),
                                "pruning/scorer=shortened_taylor"),
    "flap": (dict(method="flap", ratio=0.2), "pruning=flap"),
}


def offloaded(path, tmp_path) -> torch.nn.Module:
    """The model with every weight accelerate can offload on disk (a 1 kB memory budget)."""
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, device_map="auto",
                                                 max_memory={"cpu": 1000}, offload_folder=str(tmp_path / "offload"))
    assert has_offloaded_weights(model)
    assert model.model.layers[0].self_attn.q_proj.weight.is_meta
    return model.eval()


def resident(path) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def calibration() -> torch.Tensor:
    return torch.randint(0, VOCAB, (4, 16), generator=torch.Generator().manual_seed(0))  # [N, T]


def weights(model) -> dict[str, torch.Tensor]:
    return {name: tensor.detach().clone() for name, tensor in named_weights(model)}


def test_checks_and_counts_read_offloaded_weights(tiny_model_dirs, tmp_path):
    path = tiny_model_dirs["llama"]
    model, reference = offloaded(path, tmp_path), resident(path)
    check_finite(model, "offloaded")  # used to fail on meta tensors
    tokenizer = AutoTokenizer.from_pretrained(path)
    assert parameter_counts(wrap_model(model, tokenizer).adapter) == \
        parameter_counts(wrap_model(reference, tokenizer).adapter)
    read = weights(model)
    assert read.keys() == dict(reference.named_parameters()).keys()
    assert all(torch.equal(read[name], tensor) for name, tensor in reference.named_parameters())
    name = "model.layers.1.mlp.up_proj.weight"
    with onloaded(model.get_submodule("model.layers.1")) as layer, torch.no_grad():  # written back on exit
        layer.mlp.up_proj.weight[0, 0] = float("nan")
    assert model.get_submodule("model.layers.1.mlp.up_proj").weight.is_meta
    with pytest.raises(ModelCheckError, match=f"NaN or Inf \\(first in {name}\\)"):
        check_finite(model, "offloaded")


@pytest.mark.parametrize("family", list(ON_OFFLOADED))
def test_offloaded_weights_prune_as_the_model_in_memory(family, tiny_model_dirs, tmp_path):
    path = tiny_model_dirs["llama"]
    tokenizer = AutoTokenizer.from_pretrained(path)
    model, reference = offloaded(path, tmp_path), resident(path)
    options = ON_OFFLOADED[family]
    report = prunelab.prune(model, tokenizer, calibration=calibration(), progress=False, **copy.deepcopy(options))
    expected = prunelab.prune(reference, tokenizer, calibration=calibration(), progress=False,
                              **copy.deepcopy(options))
    assert report["sparsity"] == expected["sparsity"]
    assert report["parameters"] == expected["parameters"]
    assert report["pruning"].get("removed_layers") == expected["pruning"].get("removed_layers")
    got = weights(model)
    for name, tensor in reference.named_parameters():
        assert torch.equal(got[name], tensor), name
    ids = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():  # the pruned weights are what the offloaded forward reads
        assert torch.equal(model(input_ids=ids).logits, reference(input_ids=ids).logits)


@pytest.mark.parametrize("family", list(REFUSED))
def test_what_cannot_run_on_offloaded_weights_is_one_line(family, tiny_model_dirs, tmp_path):
    path = tiny_model_dirs["llama"]
    model = offloaded(path, tmp_path)
    before = weights(model)
    options, named = REFUSED[family]
    with pytest.raises(ConfigError, match="offloaded") as err:
        prunelab.prune(model, AutoTokenizer.from_pretrained(path), calibration=calibration(), progress=False,
                       **copy.deepcopy(options))
    assert named in str(err.value) and "\n" not in str(err.value)
    after = weights(model)
    assert all(torch.equal(before[name], after[name]) for name in before)
