"""Load a causal LM, its tokenizer and its adapter by hub id or local path.

The same `from_pretrained` path serves a 7B hub model on a GPU cluster, the shipped testbed on a
laptop CPU, and a GGUF checkpoint (converted once into a plain folder, see `models.gguf`). The architecture is checked from the config before any weight is read.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from prunelab.errors import ModelCheckError
from prunelab.models.adapter import ModelAdapter
from prunelab.models.architectures import architecture_for
from prunelab.models.boundary_operators import apply_saved_boundary_operators
from prunelab.models.checks import check_finite, check_loaded_weights, check_memory, guarded
from prunelab.models.identity import identity_digest, weight_file_hashes
from prunelab.models.spec import ModelSpec

log = logging.getLogger(__name__)

_TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass
class LoadedModel:
    model: torch.nn.Module
    tokenizer: object
    adapter: ModelAdapter
    spec: ModelSpec
    device: torch.device
    source: str  # what from_pretrained was given

    @property
    def config(self):
        return self.model.config


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ModelCheckError(f"model.device={device} but no CUDA GPU is available here; use "
                              "model.device=cpu or auto")
    return torch.device(device)


def default_cache_dir() -> Path:
    return Path(os.environ.get("PRUNELAB_CACHE") or Path.home() / ".cache" / "prunelab").expanduser()


def load_model(spec: ModelSpec, cache_dir: str | Path | None = None) -> LoadedModel:
    """Model, tokenizer and adapter; a GGUF checkpoint is first converted once into `cache_dir`."""
    if spec.gguf_file:
        from prunelab.models import gguf

        gguf_path = gguf.locate(spec.name_or_path, spec.gguf_file, spec.revision)
        source, revision = str(gguf.converted_folder(gguf_path, Path(cache_dir or default_cache_dir()))), None
    else:
        source, revision = spec.resolved_source()
    hub_kwargs = dict(revision=revision, trust_remote_code=spec.trust_remote_code)
    config = guarded("the model config", source, lambda: AutoConfig.from_pretrained(source, **hub_kwargs))
    architecture = architecture_for(config.model_type)  # unsupported: clear error, nothing loaded
    device = resolve_device(spec.device)
    check_memory(config, _TORCH_DTYPES.get(spec.dtype, spec.dtype), device, spec.device_map)
    dtype = "auto" if spec.dtype == "auto" else _TORCH_DTYPES[spec.dtype]
    if device.type == "cpu" and spec.dtype in ("float16", "bfloat16"):
        log.warning("%s on CPU is very slow on these processors; float32 is recommended", spec.dtype)
    log.info("loading %s (revision %s, %s, %s)", source, revision, spec.dtype, spec.device_map or device)
    model, info = guarded("the model weights", source, lambda: AutoModelForCausalLM.from_pretrained(
        source, config=config, dtype=dtype, device_map=spec.device_map, output_loading_info=True,
        **hub_kwargs))
    check_loaded_weights(info, source)
    check_finite(model, source)
    if spec.device_map is None:
        model.to(device)
    model.eval()
    apply_saved_boundary_operators(model, source)  # Ghosted / LinearPatch operators saved with it
    tokenizer = guarded("the tokenizer", spec.tokenizer or source,
                        lambda: AutoTokenizer.from_pretrained(spec.tokenizer or source, **hub_kwargs))
    return LoadedModel(model, tokenizer, ModelAdapter(model, architecture), spec, device, source)


def wrap_model(model: torch.nn.Module, tokenizer, label: str | None = None) -> LoadedModel:
    """A model already in memory (a notebook's `from_pretrained`, a trainer's model) as a
    LoadedModel with its adapter; an unsupported architecture is a clear error."""
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "model_type"):
        raise ModelCheckError(f"{type(model).__name__} has no Hugging Face config: pass a "
                              "transformers causal LM (AutoModelForCausalLM.from_pretrained(...))")
    architecture = architecture_for(config.model_type)
    name = getattr(config, "_name_or_path", "") or type(model).__name__
    if name.startswith((".", "/", "~")) and not Path(name).expanduser().exists():
        name = type(model).__name__  # saved from a folder that is gone: named by its class
    device = next(model.parameters()).device
    spec = ModelSpec(name_or_path=name, label=label or Path(name).name or None,
                     device=device.type if device.type in ("cpu", "cuda") else "auto")
    return LoadedModel(model, tokenizer, ModelAdapter(model, architecture), spec, device, name)


def model_identity(loaded: LoadedModel) -> dict[str, Any]:
    """What identifies the dense weights (cache keys): source, revision, dtype, weight files."""
    identity: dict[str, Any] = {"source": loaded.source, "revision": loaded.spec.revision,
                                "dtype": loaded.spec.dtype,
                                "commit": getattr(loaded.config, "_commit_hash", None)}
    if loaded.spec.gguf_file:  # the converted folder is named by the GGUF's hash
        identity["gguf_file"] = loaded.spec.gguf_file
    source = Path(loaded.source)
    if source.is_dir():
        identity["files"] = weight_file_hashes(source)  # by content, never by name and size
    return identity


def identity_key(loaded: LoadedModel) -> str:
    """16-hex digest of `model_identity`: what `prunelab aggregate` pairs dense references by."""
    return identity_digest(model_identity(loaded))
