"""Issue 13, item 7: a saved depth-pruned model with boundary operators is never silently wrong
under plain from_pretrained: exact operators are folded, the others make its load report say so."""

from __future__ import annotations

from functools import partial

import torch
from transformers import AutoModelForCausalLM

from prunelab.models import ModelSpec, load_model
from prunelab.models.boundary_operators import ATTR, INDEX_FILE, BoundaryOperator, attach, save_recovered
from prunelab.recovery.plain_loading import MARKER_KEY, save_for_plain_loading
from prunelab.tracking.saved_model import save_model_folder

IDS = torch.tensor([[1, 5, 9, 30, 7, 2, 11, 4]])


def _logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=IDS).logits


def _with_operators(model_dir, sites):
    loaded = load_model(ModelSpec(name_or_path=str(model_dir), device="cpu"))
    torch.manual_seed(0)
    hidden = loaded.config.hidden_size
    for site in sites:
        weight = torch.eye(hidden) + 0.3 * torch.randn(hidden, hidden)
        attach(loaded.model, site, BoundaryOperator(weight, "matrix", "test"), loaded.adapter)
    return loaded


def _save(loaded, target):
    return save_model_folder(loaded.model, loaded.tokenizer, target,
                             partial(save_for_plain_loading, save=save_recovered))


def test_an_operator_at_the_first_layer_is_folded_and_plain_loading_is_exact(tiny_model_dirs, tmp_path):
    loaded = _with_operators(tiny_model_dirs["llama"], [0])
    expected = _logits(loaded.model)
    folder = _save(loaded, tmp_path / "model")
    assert not (folder / INDEX_FILE).exists()  # nothing left to re-attach
    plain = AutoModelForCausalLM.from_pretrained(folder)
    torch.testing.assert_close(_logits(plain), expected, rtol=1e-4, atol=1e-4)


def test_other_operators_make_plain_loading_report_them_and_load_model_is_exact(tiny_model_dirs, tmp_path):
    loaded = _with_operators(tiny_model_dirs["llama"], [0, 2])
    expected = _logits(loaded.model)
    folder = _save(loaded, tmp_path / "model")
    plain, info = AutoModelForCausalLM.from_pretrained(folder, output_loading_info=True)
    assert MARKER_KEY in info["unexpected_keys"]  # printed in transformers' load report
    assert (_logits(plain) - expected).abs().max() > 1e-2  # what the marker warns about
    again = load_model(ModelSpec(name_or_path=str(folder), device="cpu"))
    assert len(getattr(again.model, ATTR).ops) == 1
    torch.testing.assert_close(_logits(again.model), expected, rtol=1e-4, atol=1e-4)


def test_tied_embeddings_are_not_folded(tiny_model_dirs, tmp_path):
    loaded = _with_operators(tiny_model_dirs["llama"], [0])
    loaded.model.lm_head.weight = loaded.model.get_input_embeddings().weight  # tie them
    folder = _save(loaded, tmp_path / "model")
    assert (folder / INDEX_FILE).exists()
    _, info = AutoModelForCausalLM.from_pretrained(folder, output_loading_info=True)
    assert MARKER_KEY in info["unexpected_keys"]
