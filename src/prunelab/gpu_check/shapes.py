"""Randomly initialised models of real shapes, built on the device from shipped configs: the GPU
node check's scale and timing models, with nothing to download.

`shapes/*.json` hold LlamaConfig fields only (LLaMA-2-7B's; TinyLlama-1.1B's as the 1B shape). A
model is built directly on its device in its dtype (`torch.device` context: no CPU copy of a 7B
model is ever made), seeded, so two builds are the same weights. On the CPU, and for `--quick`,
a shape is shrunk (`SHRUNK`): fewer and narrower layers, the vocabulary kept, so a check runs in
seconds while the embeddings still outweigh a layer (what streaming is about).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

SHAPES_DIR = Path(__file__).resolve().parent / "shapes"

#: Shrunk versions for the CPU and --quick: LlamaConfig fields replaced.
SHRUNK: dict[str, dict[str, int]] = {
    "llama2_7b": dict(num_hidden_layers=2, hidden_size=256, intermediate_size=688, num_attention_heads=4,
                      num_key_value_heads=4),
    "tinyllama_1b": dict(num_hidden_layers=4, hidden_size=512, intermediate_size=1408, num_attention_heads=8,
                         num_key_value_heads=2),
}


@dataclass(frozen=True)
class Shape:
    """A shipped config, maybe shrunk: `name` says which (`llama2_7b`, `tinyllama_1b (shrunk)`)."""

    base: str
    shrunk: bool = False
    fields: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"{self.base} (shrunk)" if self.shrunk else self.base

    def config(self):
        from transformers import AutoConfig

        values = dict(self.fields)
        return AutoConfig.for_model(values.pop("model_type"), **values)

    def describe(self) -> str:
        """'llama2_7b: 32 layers, hidden 4096, 6.74 B parameters' (counted on the meta device)."""
        from prunelab.models.checks import parameter_count

        config = self.config()
        return (f"{self.name}: {config.num_hidden_layers} layers, hidden {config.hidden_size}, "
                f"{parameter_count(config) / 1e9:.3g} B parameters")


def shape(name: str, shrunk: bool = False) -> Shape:
    """The shipped shape `name` (a file of shapes/), shrunk for the CPU when asked."""
    path = SHAPES_DIR / f"{name}.json"
    if not path.exists():
        known = ", ".join(sorted(p.stem for p in SHAPES_DIR.glob("*.json")))
        raise ValueError(f"no shipped shape {name!r}; shipped: {known}")
    fields = json.loads(path.read_text())
    if shrunk:
        fields.update(SHRUNK[name])
    return Shape(name, shrunk, fields)


def random_model(config, device: torch.device, dtype: torch.dtype, seed: int = 0) -> torch.nn.Module:
    """The model of `config` with seeded random weights, allocated on `device` in `dtype`."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.eval()


def random_ids(vocab_size: int, nsamples: int, seqlen: int, seed: int = 0) -> torch.Tensor:
    """[nsamples, seqlen] token ids drawn uniformly: calibration for a random model."""
    return torch.randint(0, vocab_size, (nsamples, seqlen), generator=torch.Generator().manual_seed(seed))


def saved_random_model(config, folder: Path, tokenizer, device: torch.device, dtype: torch.dtype,
                       seed: int = 0) -> Path:
    """A random model written as a Hugging Face folder (safetensors, with `tokenizer`), so it can be
    loaded resident or streamed like a hub checkpoint; built on `device`, freed before returning."""
    model = random_model(config, device, dtype, seed)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return folder
