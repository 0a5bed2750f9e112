"""Load a causal LM, its tokenizer and its adapter by hub id or local path.

The same `from_pretrained` path serves a 7B hub model on a GPU cluster, the shipped testbed on a
laptop CPU, and a GGUF checkpoint (converted once into a plain folder, see `models.gguf`). The architecture is checked from the config before any weight is read.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from prunelab.errors import ModelCheckError
from prunelab.models.adapter import ModelAdapter
from prunelab.models.architectures import architecture_for
from prunelab.models.boundary_operators import apply_saved_boundary_operators
from prunelab.models.checks import (
    SKIP_MEMORY_CHECK, check_finite, check_loaded_weights, check_memory, cuda_memory_cap, free_bytes,
    guarded,
)
from prunelab.models.memory import (
    check_disk, choose_mode, default_state_bytes, detected_budget, estimate, gib, streamed_disk_bytes,
)
from prunelab.models.identity import identity_digest, weight_file_hashes
from prunelab.models.spec import ModelSpec
from prunelab.models.streaming import store_of, streamed_skeleton
from prunelab.models.slicing import SLICING_KEY, apply_slicing
from prunelab.models.width import SHAPES_KEY, apply_layer_shapes

log = logging.getLogger(__name__)

_TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass
class MemoryRequest:
    """What a run will hold besides the weights, so `load_model` can choose resident or streamed
    (`model.streaming=auto`) and refuse a run that cannot fit, before any weight is read."""

    activation_tokens: int  # calibration sequences x length (or the evaluation's, if larger)
    batch_tokens: int | None = None  # one calibration batch (what stays in memory when spilled)
    state_bytes: Callable[[int, int], int] = default_state_bytes  # the method's, per [out, in] linear
    budget_bytes: int | None = None  # runtime.memory_budget_gb; None: detected (models.memory)
    work_dir: Path | None = None  # where a streamed run writes its changed layers
    layer_gradients: bool = False  # the method back-propagates (graph and gradient sums: models.memory.estimate)
    forward_checkpoint: bool = False  # zero-shot evaluation: a streamed model is saved for offload
    rewrites_layers: bool = True  # width pruning (or a recovery) rewrites every layer; depth pruning none


@dataclass
class LoadedModel:
    model: torch.nn.Module
    tokenizer: object
    adapter: ModelAdapter
    spec: ModelSpec
    device: torch.device
    source: str  # what from_pretrained was given
    mode: str = "resident"  # or "streamed": decoder layers read from the checkpoint one at a time
    memory: dict[str, Any] | None = None  # the estimate and budget the mode was chosen under

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


def _checkpoint_dtype(config, dtype: str) -> torch.dtype:
    if dtype != "auto":
        return _TORCH_DTYPES[dtype]
    value = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None) or torch.float32
    return getattr(torch, value) if isinstance(value, str) else value


def choose_memory_mode(spec: ModelSpec, config, memory: MemoryRequest | None,
                       device: torch.device | None = None) -> tuple[str, dict | None]:
    """("resident" | "streamed", the estimate and budgets for the record) for this model and run.

    On a GPU (`device` cuda, no device_map) the weights, the method's state and the activations
    live on the device: they are planned against its free memory (`torch.cuda.mem_get_info`), and
    activations that do not fit there beside the layer go to the host, then to disk, planned
    against the host's budget. On the CPU everything is planned against the host's."""
    if memory is None:
        return ("streamed" if spec.streaming is True else "resident"), None
    need = estimate(config, _checkpoint_dtype(config, spec.dtype), memory.activation_tokens,
                    memory.state_bytes, memory.batch_tokens, memory.layer_gradients)
    budget, origin = ((memory.budget_bytes, "runtime.memory_budget_gb") if memory.budget_bytes
                      else detected_budget())
    skip = bool(os.environ.get(SKIP_MEMORY_CHECK))
    if skip:
        budget = None if spec.streaming != "auto" else budget
    if device is not None and device.type == "cuda" and spec.device_map is None:
        return _gpu_memory_mode(spec, memory, need, (budget, origin), device, skip)
    mode, spill = choose_mode(spec.streaming, need, budget, origin)
    record = {"estimate_bytes": need.as_dict(), "budget_bytes": budget, "budget_from": origin,
              "activations_spilled": spill}
    if mode == "streamed":
        record["disk_estimate_bytes"] = streamed_disk_bytes(need, spill, memory.layer_gradients,
                                                            memory.forward_checkpoint, memory.rewrites_layers)
    return mode, record


def _gpu_memory_mode(spec: ModelSpec, memory: MemoryRequest, need, host: tuple[int | None, str],
                     device: torch.device, skip: bool) -> tuple[str, dict]:
    """`choose_memory_mode` for a model on one GPU: the device's part against its free memory (what
    the process's allocator cap leaves, when one is set: `cuda_memory_cap`), the host's
    part (the process, and the activations when the GPU cannot hold them) against the host."""
    free = free_bytes(device)
    gpu_budget = None if skip and spec.streaming != "auto" else free
    cap = cuda_memory_cap(device)
    gpu_origin = (f"the free memory of {device} (torch.cuda.mem_get_info)" if cap is None else
                  f"what this process's cap of {gib(cap)} on {device} leaves free "
                  "(torch.cuda.set_per_process_memory_fraction)")
    on_gpu = dataclasses.replace(need, baseline=0)  # the process's own memory is the host's
    mode, spill = choose_mode(spec.streaming, on_gpu, gpu_budget, gpu_origin)
    host_budget, host_origin = host
    activations_on = "device"
    if spill:  # one batch stays on the GPU, the rest goes to the host if it fits there, else to disk
        fits_host = host_budget is None or need.baseline + need.activations <= host_budget
        activations_on = "host" if fits_host else "disk"
    record = {"estimate_bytes": need.as_dict(), "budget_bytes": gpu_budget, "budget_from": gpu_origin,
              "host_budget_bytes": host_budget, "host_budget_from": host_origin,
              "activations_spilled": activations_on == "disk", "activations_on": activations_on}
    if mode == "streamed":
        record["disk_estimate_bytes"] = streamed_disk_bytes(
            need, activations_on == "disk", memory.layer_gradients, memory.forward_checkpoint,
            memory.rewrites_layers)
    return mode, record


def load_model(spec: ModelSpec, cache_dir: str | Path | None = None,
               memory: MemoryRequest | None = None) -> LoadedModel:
    """Model, tokenizer and adapter; a GGUF checkpoint is first converted once into `cache_dir`.

    With `spec.streaming` true (or auto, when the run's estimate exceeds its budget: `memory`), the
    model is streamed (`models.streaming`): a skeleton whose decoder layers are read from the
    checkpoint one at a time by every layer-sequential pass."""
    if spec.gguf_file:
        from prunelab.models import gguf

        cache = Path(cache_dir or default_cache_dir())
        gguf_path = gguf.locate(spec.name_or_path, spec.gguf_file, spec.revision, cache)
        source, revision = str(gguf.converted_folder(gguf_path, cache)), None
    else:
        source, revision = spec.resolved_source()
    hub_kwargs = dict(revision=revision, trust_remote_code=spec.trust_remote_code)
    config = guarded("the model config", source, lambda: AutoConfig.from_pretrained(source, **hub_kwargs))
    architecture = architecture_for(config.model_type)  # unsupported: clear error, nothing loaded
    device = resolve_device(spec.device)
    mode, memory_record = choose_memory_mode(spec, config, memory, device)
    if mode == "streamed":
        return _load_streamed(spec, source, config, architecture, device, memory, memory_record,
                              hub_kwargs, cache_dir)
    if memory_record is None:  # no run estimate: the weights against the free memory
        check_memory(config, _TORCH_DTYPES.get(spec.dtype, spec.dtype), device, spec.device_map)
    dtype = "auto" if spec.dtype == "auto" else _TORCH_DTYPES[spec.dtype]
    if device.type == "cpu" and spec.dtype in ("float16", "bfloat16"):
        log.warning("%s on CPU is very slow on these processors; float32 is recommended", spec.dtype)
    log.info("loading %s (revision %s, %s, %s)", source, revision, spec.dtype, spec.device_map or device)
    if getattr(config, SHAPES_KEY, None) or getattr(config, SLICING_KEY, None):  # width-pruned or sliced
        if spec.device_map is not None:
            raise ModelCheckError(f"{source} is width-pruned (per-layer shapes): load it with "
                                  "model.device_map=null")
        model, info = guarded("the model weights", source, lambda: load_resized(
            source, config, dtype, architecture, hub_kwargs))
    else:
        placement = _placement(spec, cache_dir)
        model, info = guarded("the model weights", source, lambda: AutoModelForCausalLM.from_pretrained(
            source, config=config, dtype=dtype, output_loading_info=True, **placement, **hub_kwargs))
    check_loaded_weights(info, source)
    check_finite(model, source)
    if spec.device_map is None:
        model.to(device)
    model.eval()
    apply_saved_boundary_operators(model, source)  # Ghosted / LinearPatch operators saved with it
    tokenizer = guarded("the tokenizer", spec.tokenizer or source,
                        lambda: AutoTokenizer.from_pretrained(spec.tokenizer or source, **hub_kwargs))
    return LoadedModel(model, tokenizer, ModelAdapter(model, architecture), spec, device, source,
                       memory=memory_record)


def _placement(spec: ModelSpec, cache_dir) -> dict[str, Any]:
    """`from_pretrained`'s placement keywords: accelerate's device map, its memory budget and, for
    weights beyond it, a folder of this run's own to offload them to."""
    if spec.device_map is None:
        return {"device_map": None}
    placement: dict[str, Any] = {"device_map": spec.device_map}
    if spec.max_memory is not None:
        placement["max_memory"] = {int(k) if str(k).isdigit() else k: v for k, v in dict(spec.max_memory).items()}
        folder = Path(spec.offload_folder) if spec.offload_folder else Path(cache_dir or default_cache_dir()) / "offload"
        folder.mkdir(parents=True, exist_ok=True)
        placement["offload_folder"] = spec.offload_folder or tempfile.mkdtemp(dir=folder)
    return placement


def load_resized(source: str, config, dtype, architecture, hub_kwargs: dict) -> tuple[torch.nn.Module, dict]:
    """A width-pruned checkpoint (`config.prunelab_layer_shapes`, `models.width`, or SliceGPT's
    `config.prunelab_slicing`, `models.slicing`): the model built from its config without
    allocating weights, each layer cut to its stored shape (or sliced and given its shortcuts), then the saved
    tensors assigned. Returns the model and `output_loading_info`'s missing and unexpected keys."""
    from accelerate import init_empty_weights
    from safetensors.torch import load_file

    folder = Path(source)
    if not folder.is_dir():  # a hub id: its files fetched once
        from huggingface_hub import snapshot_download

        folder = Path(snapshot_download(source, revision=hub_kwargs.get("revision"),
                                        allow_patterns=["*.json", "*.safetensors"]))
    with init_empty_weights():  # parameters on meta; buffers (rotary frequencies) computed
        model = AutoModelForCausalLM.from_config(config, dtype=None if dtype == "auto" else dtype,
                                                 trust_remote_code=hub_kwargs.get("trust_remote_code", False))
    apply_layer_shapes(ModelAdapter(model, architecture))
    apply_slicing(ModelAdapter(model, architecture))
    state = {}
    for file in sorted(folder.glob("*.safetensors")):
        state.update(load_file(str(file)))
    if dtype != "auto":
        state = {name: tensor.to(dtype) if tensor.is_floating_point() else tensor for name, tensor in state.items()}
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    if getattr(config, "tie_word_embeddings", False):
        model.tie_weights()
        missing = [name for name in missing if not name.startswith("lm_head.")]
    return model, {"missing_keys": missing, "unexpected_keys": unexpected}


def _load_streamed(spec: ModelSpec, source: str, config, architecture, device: torch.device,
                   memory: MemoryRequest | None, memory_record: dict | None, hub_kwargs: dict,
                   cache_dir) -> LoadedModel:
    if spec.device_map is not None:
        raise ModelCheckError("model.streaming reads one layer at a time onto model.device: "
                              "set model.device_map=null")
    if getattr(config, SHAPES_KEY, None) or getattr(config, SLICING_KEY, None):
        raise ModelCheckError(f"{source} is width-pruned (per-layer shapes), which streaming does not "
                              "read yet: set model.streaming=false")
    if not Path(source).is_dir():  # a hub id: the shards are fetched once, then read from disk
        from huggingface_hub import snapshot_download

        source = guarded("the model files", source, lambda: snapshot_download(
            source, revision=hub_kwargs.get("revision"), allow_patterns=["*.json", "*.safetensors",
                                                                          "*.model", "*.txt"]))
    temp_parent = str(cache_dir) if cache_dir and Path(cache_dir).is_dir() else None
    if memory_record and memory_record.get("disk_estimate_bytes") and not os.environ.get(SKIP_MEMORY_CHECK):
        check_disk(memory_record["disk_estimate_bytes"],
                   Path(memory.work_dir) if memory.work_dir else Path(temp_parent or tempfile.gettempdir()))
    work_dir = Path(memory.work_dir) if memory and memory.work_dir else Path(tempfile.mkdtemp(
        prefix="prunelab-streamed-", dir=temp_parent))
    log.info("streaming %s (%s, %s): decoder layers read one at a time; changed layers in %s",
             source, spec.dtype, device, work_dir)
    model = guarded("the model weights", source, lambda: streamed_skeleton(
        source, config, _checkpoint_dtype(config, spec.dtype), device, architecture, work_dir))
    apply_saved_boundary_operators(model, source)
    if memory_record and memory_record.get("activations_on") == "host":
        store_of(model).host_activations = True
        log.info("calibration activations (%.2f GiB) exceed %s's budget beside the layer: kept in host memory",
                 memory_record["estimate_bytes"]["activations"] / 1024**3, device)
    if memory_record and memory_record.get("activations_spilled"):
        store_of(model).spill_dir = work_dir / "activations"
        log.info("calibration activations (%.2f GiB) exceed the budget beside the layer: spilled to %s",
                 memory_record["estimate_bytes"]["activations"] / 1024**3, work_dir / "activations")
    tokenizer = guarded("the tokenizer", spec.tokenizer or source,
                        lambda: AutoTokenizer.from_pretrained(spec.tokenizer or source, **hub_kwargs))
    return LoadedModel(model, tokenizer, ModelAdapter(model, architecture), spec, device, str(source),
                       mode="streamed", memory=memory_record)


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


def cache_identity(loaded: LoadedModel) -> dict[str, Any]:
    """`model_identity` plus where and in what the numbers are computed (device type, parameter
    dtype): the key of a cached dense metric or statistic, so that a CUDA bfloat16 run never reuses
    a CPU float32 run's. Not the pairing key of records (`identity_key`)."""
    parameter = next((p for p in loaded.model.parameters() if p.is_floating_point()), None)
    dtype = str(parameter.dtype).removeprefix("torch.") if parameter is not None else loaded.spec.dtype
    return {**model_identity(loaded), "computed_on": {"device": loaded.device.type, "dtype": dtype}}


def identity_key(loaded: LoadedModel) -> str:
    """16-hex digest of `model_identity`: what `prunelab aggregate` pairs dense references by."""
    return identity_digest(model_identity(loaded))
