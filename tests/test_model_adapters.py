"""One contract, every architecture: what methods rely on the adapter for."""

from __future__ import annotations

import pytest
import torch
from tiny import ARCHS, VOCAB
from torch import nn
from transformers import AutoModelForCausalLM

from prunelab.errors import ConfigError, UnsupportedModelError
from prunelab.models import ROLES, ModelSpec, architecture_for, load_model


@pytest.fixture(params=ARCHS)
def loaded(request, tiny_model_dirs):
    return load_model(ModelSpec(name_or_path=str(tiny_model_dirs[request.param]), device="cpu"))


def tokens(n: int = 2, t: int = 16) -> torch.Tensor:
    return torch.randint(0, VOCAB, (n, t), generator=torch.Generator().manual_seed(0))


class TestAdapterContract:
    def test_layers_and_linears_by_role(self, loaded):
        adapter = loaded.adapter
        assert adapter.num_layers == loaded.config.num_hidden_layers == 4
        for layer in adapter.layers:
            for role in ROLES:
                linears = adapter.linears(layer, (role,))
                assert linears and all(isinstance(m, nn.Linear) for m in linears.values())
            attn_out, mlp_out = adapter.residual_writers(layer)
            assert attn_out.out_features == mlp_out.out_features == adapter.hidden_size
            assert all(isinstance(n, nn.Module) for n in adapter.norms(layer))
        assert len(adapter.prunable_linears()) == 4 * len(adapter.linears(adapter.layers[0]))

    def test_embeddings_and_head_are_not_prunable(self, loaded):
        prunable = {id(m) for m in loaded.adapter.prunable_linears().values()}
        assert id(loaded.adapter.lm_head) not in prunable

    def test_layers_called_alone_reproduce_the_forward_pass(self, loaded):
        from prunelab.calibration import LayerSequentialRunner, capture_layer_inputs

        ids = tokens()
        inputs = capture_layer_inputs(loaded.adapter, ids, batch_size=2)
        runner = LayerSequentialRunner(loaded.adapter, inputs, progress=False)
        for _ in runner:
            pass
        hidden = torch.cat(runner.outputs.hidden)
        with torch.no_grad():
            expected = loaded.model(input_ids=ids, use_cache=False).logits
            actual = loaded.adapter.logits_from_hidden(hidden)
        torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5)

    def test_removed_layers_save_and_reload_to_identical_logits(self, loaded, tmp_path):
        removed = loaded.adapter.remove_layers([1, 2])
        assert removed == [1, 2] and loaded.adapter.num_layers == 2
        ids = tokens()
        with torch.no_grad():
            expected = loaded.model(input_ids=ids, use_cache=False).logits
        loaded.model.save_pretrained(tmp_path, safe_serialization=True)
        reloaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
        assert reloaded.config.num_hidden_layers == 2
        with torch.no_grad():
            torch.testing.assert_close(reloaded(input_ids=ids, use_cache=False).logits, expected)
            generated = reloaded.generate(ids[:1, :4], max_new_tokens=4, do_sample=False, use_cache=True)
        assert generated.shape == (1, 8)

    def test_removing_no_layers_changes_nothing(self, loaded):
        ids = tokens()
        with torch.no_grad():
            before = loaded.model(input_ids=ids, use_cache=False).logits
            loaded.adapter.remove_layers([])
            after = loaded.model(input_ids=ids, use_cache=False).logits
        assert torch.equal(before, after)


def test_unsupported_model_type_lists_the_supported_ones():
    with pytest.raises(UnsupportedModelError, match="supported: gemma3_text, gpt_neox, llama, mistral, opt, qwen2, qwen3"):
        architecture_for("bert")


def test_missing_local_path_is_a_config_error():
    with pytest.raises(ConfigError, match="does not exist"):
        ModelSpec(name_or_path="/no/such/model")


def test_hub_ids_are_not_taken_for_paths():
    spec = ModelSpec(name_or_path="meta-llama/Llama-2-7b-hf", revision="main")
    assert spec.resolved_source() == ("meta-llama/Llama-2-7b-hf", "main")


def test_local_revision_selects_a_checkpoint_subfolder(tiny_model_dirs, tmp_path):
    import shutil

    for step in ("step0", "step1000"):
        shutil.copytree(tiny_model_dirs["gpt_neox"], tmp_path / step)
    assert ModelSpec(name_or_path=str(tmp_path), revision="step0").resolved_source()[0].endswith("step0")
    assert ModelSpec(name_or_path=str(tmp_path)).resolved_source()[0].endswith("step1000")
