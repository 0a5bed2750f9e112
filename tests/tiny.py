"""Tiny random models of every supported architecture and a tokenizer trained on the fly."""

from __future__ import annotations

from pathlib import Path

import torch

TEXT = (
    "the cat sat on the mat . the dogs that the boy owns are happy . she gives the key to him . "
    "seven plus five is twelve . alice lives in paris and works as a baker . "
) * 40

VOCAB = 320


def tiny_config(arch: str):
    """A 4-layer random model config of the given architecture, fast on CPU."""
    from transformers import (Gemma3TextConfig, GPTNeoXConfig, LlamaConfig, MistralConfig, OPTConfig, Qwen2Config,
                              Qwen3Config)

    common = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                  num_attention_heads=4, max_position_embeddings=128)
    if arch == "llama":
        return LlamaConfig(num_key_value_heads=2, **common)
    if arch == "mistral":
        return MistralConfig(num_key_value_heads=2, sliding_window=None, **common)
    if arch == "qwen2":
        return Qwen2Config(num_key_value_heads=2, **common)
    if arch == "qwen3":
        return Qwen3Config(num_key_value_heads=2, head_dim=8, **common)
    if arch == "gpt_neox":
        return GPTNeoXConfig(use_parallel_residual=True, **common)
    if arch == "opt":
        return OPTConfig(vocab_size=VOCAB, hidden_size=32, ffn_dim=64, num_hidden_layers=4,
                         num_attention_heads=4, max_position_embeddings=128, word_embed_proj_dim=32)
    if arch == "gemma3_text":  # sliding-window and global layers mixed; the window shorter than test sequences
        return Gemma3TextConfig(num_key_value_heads=2, head_dim=8, sliding_window=6, query_pre_attn_scalar=8,
                                layer_types=["sliding_attention", "full_attention", "sliding_attention",
                                             "full_attention"],
                                rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                                                 "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}},
                                **common)
    raise ValueError(arch)


ARCHS = ("llama", "mistral", "qwen2", "qwen3", "gpt_neox", "opt", "gemma3_text")


def train_tokenizer(directory: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([TEXT], trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>",
                                   eos_token="<|endoftext|>")
    fast.save_pretrained(directory)
    return fast


def make_tiny_model(arch: str, directory: Path, seed: int = 0) -> Path:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(arch))
    if arch == "gemma3_text":  # its norms start at weight 0 (a gain of 1 + 0): make (1 + weight) matter
        with torch.no_grad():
            for name, parameter in model.named_parameters():
                if name.endswith("norm.weight"):
                    parameter.copy_(0.3 * torch.randn_like(parameter))
    model.save_pretrained(directory, safe_serialization=True)
    train_tokenizer(directory)
    return directory


def assert_nm_pattern(adapter, n: int, m: int) -> None:
    """Every row of every prunable linear has exactly n zeros in each group of m inputs."""
    for name, lin in adapter.prunable_linears().items():
        zeros = (lin.weight == 0).reshape(lin.weight.shape[0], -1, m).sum(-1)  # [out, in/m]
        assert bool((zeros == n).all()), name
