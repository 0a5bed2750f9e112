"""Where each supported architecture keeps its parts: the only place that knows HF attribute paths.

One `Architecture` entry per model family, chosen from `config.model_type` in `ARCHITECTURES`.
Paths of a layer's modules are relative to the decoder layer; model-level paths are relative to the
`*ForCausalLM` module. Roles follow the residual stream: `attn_in` read it, `attn_out` writes it
back (o_proj / dense / out_proj), likewise `mlp_in` and `mlp_out` (down_proj / dense_4h_to_h / fc2).
`attn_norm` / `mlp_norm` are the norms that read the residual before attention / the MLP. Gemma 3
adds what Llama-like layers lack: a norm on each block's output before it joins the residual
(`attn_post_norm`, `mlp_post_norm`), per-head q/k norms, RMSNorms that scale by (1 + weight)
(`norm_offset`), embeddings multiplied by sqrt(hidden size), and layers of different attention
types (sliding window or global, `config.layer_types`) that receive different masks and rotary
embeddings (the adapter keeps each layer's own).
"""

from __future__ import annotations

from dataclasses import dataclass

from prunelab.errors import UnsupportedModelError


@dataclass(frozen=True)
class Architecture:
    name: str
    layers: str  # ModuleList of decoder layers
    embeddings: tuple[str, ...]  # never pruned (nor is the output head: get_output_embeddings())
    final_norm: str  # applied after the last layer, before lm_head
    attention: str  # the attention module (carries `layer_idx` for the KV cache)
    attn_in: tuple[str, ...]
    attn_out: str
    mlp_in: tuple[str, ...]
    mlp_out: str
    attn_norm: str
    mlp_norm: str
    rotary: str | None = None  # model-level rotary embedding, when shared across layers
    parallel_residual: bool = False  # attention and MLP both read the layer input (GPT-NeoX)
    width_resizable: bool = False  # separate q/k/v rows per (kv) head and gate/up/down channels (models.width)
    attn_post_norm: str | None = None  # norm on the attention output before the residual add (Gemma 3)
    mlp_post_norm: str | None = None  # norm on the MLP output before the residual add (Gemma 3)
    qk_norms: tuple[str, ...] = ()  # per-head norms of queries and keys (Qwen3, Gemma 3)
    norm_offset: float = 0.0  # an RMSNorm multiplies by (norm_offset + weight): 1 for Gemma
    scaled_embeddings: bool = False  # the embedding module multiplies by its `embed_scale` (Gemma: sqrt(hidden))


_LLAMA_LIKE = dict(
    layers="model.layers",
    embeddings=("model.embed_tokens",),
    final_norm="model.norm",
    attention="self_attn",
    attn_in=("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    attn_out="self_attn.o_proj",
    mlp_in=("mlp.gate_proj", "mlp.up_proj"),
    mlp_out="mlp.down_proj",
    attn_norm="input_layernorm",
    mlp_norm="post_attention_layernorm",
    rotary="model.rotary_emb",
    width_resizable=True,
)

ARCHITECTURES: dict[str, Architecture] = {
    "llama": Architecture(name="llama", **_LLAMA_LIKE),
    "mistral": Architecture(name="mistral", **_LLAMA_LIKE),
    "qwen2": Architecture(name="qwen2", **_LLAMA_LIKE),
    "qwen3": Architecture(name="qwen3", qk_norms=("self_attn.q_norm", "self_attn.k_norm"), **_LLAMA_LIKE),
    "gemma3_text": Architecture(
        name="gemma3_text",
        **{**_LLAMA_LIKE, "mlp_norm": "pre_feedforward_layernorm"},  # its post_attention_layernorm is a post-norm
        attn_post_norm="post_attention_layernorm",
        mlp_post_norm="post_feedforward_layernorm",
        qk_norms=("self_attn.q_norm", "self_attn.k_norm"),
        norm_offset=1.0,
        scaled_embeddings=True,
    ),
    "gpt_neox": Architecture(
        name="gpt_neox",
        layers="gpt_neox.layers",
        embeddings=("gpt_neox.embed_in",),
        final_norm="gpt_neox.final_layer_norm",
        attention="attention",
        attn_in=("attention.query_key_value",),
        attn_out="attention.dense",
        mlp_in=("mlp.dense_h_to_4h",),
        mlp_out="mlp.dense_4h_to_h",
        attn_norm="input_layernorm",
        mlp_norm="post_attention_layernorm",
        rotary="gpt_neox.rotary_emb",
        parallel_residual=True,
    ),
    "opt": Architecture(
        name="opt",
        layers="model.decoder.layers",
        embeddings=("model.decoder.embed_tokens", "model.decoder.embed_positions"),
        final_norm="model.decoder.final_layer_norm",
        attention="self_attn",
        attn_in=("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
        attn_out="self_attn.out_proj",
        mlp_in=("fc1",),
        mlp_out="fc2",
        attn_norm="self_attn_layer_norm",
        mlp_norm="final_layer_norm",
    ),
}


def architecture_for(model_type: str) -> Architecture:
    try:
        return ARCHITECTURES[model_type]
    except KeyError:
        raise UnsupportedModelError(
            f"model_type {model_type!r} is not supported; supported: {', '.join(sorted(ARCHITECTURES))}"
        ) from None
