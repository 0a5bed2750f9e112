"""Decoder layers streamed from the checkpoint: prune and evaluate models larger than memory.

A streamed model is the `*ForCausalLM` skeleton on the meta device (no weight allocated) with its
final norm (and embeddings tied to the head) read into memory. Its decoder layers, input
embeddings and untied head stay on disk: a layer-sequential pass (`calibration.runner`) asks
`LayerStore.resident(layer)` for one layer at a time (the capture asks for the embeddings, the
logits for the head), which reads that module's tensors from the safetensors shards (plain file reads,
`safetensors_files`), and on exit writes the layer to a shard of its own if the pass changed it
(in-place edits are seen through the tensors' version counters) and puts it back on meta. Later
passes (evaluation after pruning) read the changed layers from those shards. `save_checkpoint`
writes the current model as a standard sharded checkpoint, one layer in memory at a time.

In memory at once, then: the final norm, one module (a decoder layer, the embeddings or the head),
the calibration activations and the method's per-layer state; never the whole model (the references keep all of it in host RAM:
SparseGPT's llama.py, Wanda's prune_wanda, llm-compressor's sequential onloading).
"""

from __future__ import annotations

import ctypes
import itertools
import math
import os
import resource
import logging
import shutil
import weakref
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path

import torch
from torch import nn
from tqdm.auto import tqdm

from prunelab.errors import ModelCheckError
from prunelab.models.architectures import Architecture
from prunelab.models.safetensors_files import (
    TensorLocation, checkpoint_tensors, read_header, read_tensor, write_index, write_shard,
)

log = logging.getLogger(__name__)

_STORES: weakref.WeakKeyDictionary[nn.Module, LayerStore] = weakref.WeakKeyDictionary()


def store_of(model: nn.Module) -> LayerStore | None:
    """The LayerStore of a streamed model, or None for a model held in memory."""
    return _STORES.get(model)


def release_freed_memory() -> None:
    """Give freed heap pages back to the OS (glibc keeps ~90 MB per freed layer otherwise)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _prefer_mmap_for_large_buffers() -> None:
    """Allocations >= 64 KiB as their own mappings, returned to the OS when freed, the heap's top
    trimmed above 64 KiB, and two malloc arenas (as MALLOC_MMAP_THRESHOLD_=65536
    MALLOC_TRIM_THRESHOLD_=65536 MALLOC_ARENA_MAX=2 would do): a freed layer or activation batch
    must not stay in a fragmented heap, whose size counts against a data limit even when its
    pages are free. Set only under a data limit (`ulimit -d`, `prlimit --data`): a cgroup limit
    (SLURM's `--mem`) counts resident pages, which `release_freed_memory` returns after each
    layer, while fresh mappings for every large temporary cost page faults."""
    if resource.getrlimit(resource.RLIMIT_DATA)[0] == resource.RLIM_INFINITY:
        return  # the settings cost CPU time (about 20% for SparseGPT's matrix products)
    # MKL's own memory manager keeps the buffers of large matrix products (measured: about
    # 100 MB more data segment for SparseGPT on a 1536-wide model); read when MKL first allocates
    os.environ.setdefault("MKL_DISABLE_FAST_MM", "1")
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 1 << 16)  # M_MMAP_THRESHOLD
        libc.mallopt(-1, 1 << 16)  # M_TRIM_THRESHOLD
        libc.mallopt(-8, 2)  # M_ARENA_MAX
    except (OSError, AttributeError):
        pass


def _set_tensor(module: nn.Module, name: str, value: torch.Tensor) -> None:
    owner_path, _, attr = name.rpartition(".")
    owner = module.get_submodule(owner_path) if owner_path else module
    if attr in owner._parameters:
        owner._parameters[attr] = nn.Parameter(value, requires_grad=False)
    elif attr in owner._buffers:
        owner._buffers[attr] = value
    else:
        raise ModelCheckError(f"the checkpoint has a tensor {name!r} the model does not define")


def _get_tensor(module: nn.Module, name: str) -> torch.Tensor:
    owner_path, _, attr = name.rpartition(".")
    owner = module.get_submodule(owner_path) if owner_path else module
    return owner._parameters[attr] if attr in owner._parameters else owner._buffers[attr]


class LayerStore:
    """Where each decoder layer's tensors are, and the one-layer-at-a-time access to them.

    Args:
        model: the skeleton, layers on meta.
        arch: its architecture entry (the layers' attribute path).
        tensors: name -> location of every tensor of the source checkpoint.
        work_dir: where changed layers are written (a folder of this run; removed at `close`, or
            when the model is garbage-collected or the interpreter exits, whichever comes first).
        device: where layers are read to and computed.

    The store holds its model weakly (it is the value of a weak-keyed map from the model), so a
    notebook that drops a streamed model frees it and its work folder.
    """

    def __init__(self, model: nn.Module, arch: Architecture, tensors: dict[str, TensorLocation],
                 work_dir: Path, device: torch.device):
        self._model = weakref.ref(model)
        self.arch, self.device = arch, torch.device(device)
        self.source = Path(next(iter(tensors.values())).file).parent if tensors else None
        self.source_layers = len(model.get_submodule(arch.layers))
        self.work_dir = Path(work_dir)
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self._remove_work_dir = weakref.finalize(self, shutil.rmtree, str(self.work_dir), True)
        layers = model.get_submodule(arch.layers)
        self.sources: dict[nn.Module, dict[str, TensorLocation]] = {}
        for index, layer in enumerate(layers):
            prefix = f"{arch.layers}.{index}."
            self.sources[layer] = {name[len(prefix):]: loc for name, loc in tensors.items()
                                   if name.startswith(prefix)}
        #: the input embeddings and an untied head, read only while a pass uses them (capture,
        #: logits), by path: they are the largest tensors outside the layers
        self.outside: dict[str, nn.Module] = {}
        for path in streamed_outside_paths(model, arch):
            module = model.get_submodule(path)
            self.sources[module] = {name[len(path) + 1:]: loc for name, loc in tensors.items()
                                    if name.startswith(path + ".")}
            self.outside[path] = module
        self._resident: dict[nn.Module, tuple[int, dict[str, tuple[int, int, int]]]] = {}
        self._serial = itertools.count()
        self.reads = self.writes = 0  # layers read from disk and written back (for the record)
        #: what evaluation passes may hold in activations at once (windows are grouped to fit)
        self.activation_budget_bytes = 2 * 1024**3
        #: where activations spill when they do not fit beside the layer (None: kept in memory)
        self.spill_dir: Path | None = None
        self.host_activations = False  # GPU activations kept in host memory (the device's budget is short)
        self.spilled = 0  # activations kept in file-backed mappings so far
        _prefer_mmap_for_large_buffers()

    def layer_bytes(self, layer: nn.Module) -> int:
        return sum(loc.nbytes for loc in self.sources[layer].values())

    @contextmanager
    def resident(self, layer: nn.Module, device: torch.device | None = None) -> Iterator[nn.Module]:
        """The layer with its weights in memory on `device` (default: the store's) for the
        duration; written to its own shard on exit when its tensors were changed. Re-entrant."""
        if layer in self._resident:
            count, seen = self._resident[layer]
            self._resident[layer] = (count + 1, seen)
            try:
                yield layer
            finally:
                count, seen = self._resident[layer]
                self._resident[layer] = (count - 1, seen)
            return
        self._load(layer, device or self.device)
        try:
            yield layer
        finally:
            self._unload(layer)

    def _load(self, layer: nn.Module, device: torch.device) -> None:
        seen = {}
        for name, location in self.sources[layer].items():
            skeleton = _get_tensor(layer, name)
            value = read_tensor(location, device).to(skeleton.dtype)
            _set_tensor(layer, name, value)
            current = _get_tensor(layer, name)
            seen[name] = (id(current), current._version, current.data_ptr())
        self._resident[layer] = (1, seen)
        self.reads += 1

    def _changed(self, layer: nn.Module, seen: dict[str, tuple[int, int, int]]) -> bool:
        for name, (ident, version, pointer) in seen.items():
            current = _get_tensor(layer, name)
            if id(current) != ident or current._version != version or current.data_ptr() != pointer:
                return True
        return False

    def _unload(self, layer: nn.Module) -> None:
        count, seen = self._resident[layer]
        if count > 1:
            self._resident[layer] = (count - 1, seen)
            return
        try:
            if self._changed(layer, seen):
                self._write(layer)
        finally:
            del self._resident[layer]
            for name, location in self.sources[layer].items():
                skeleton = _get_tensor(layer, name)
                _set_tensor(layer, name, torch.empty(location.shape, dtype=skeleton.dtype, device="meta"))
            release_freed_memory()

    def _write(self, layer: nn.Module) -> None:
        """The layer's current tensors into a new shard of the work folder; the sources follow."""
        path = self.work_dir / f"layer-{next(self._serial):05d}.safetensors"
        write_shard(path, {name: _get_tensor(layer, name) for name in self.sources[layer]})
        previous = {loc.file for loc in self.sources[layer].values()}
        self.sources[layer] = read_header(path)
        for old in previous:  # an earlier version of this layer, written by this store
            if old.parent == self.work_dir and old != path:
                old.unlink(missing_ok=True)
        self.writes += 1

    def layers(self) -> nn.ModuleList:
        return self.model.get_submodule(self.arch.layers)

    def keep_activation(self, tensor: torch.Tensor) -> torch.Tensor:
        """`tensor` as the runner keeps it between layers: where it was computed; in host memory
        when it is on a GPU whose budget cannot hold the activations (`host_activations`); or, with
        `spill_dir` set (the activations exceed the host's budget too), in a file-backed shared
        mapping that the kernel pages out as needed and that disappears with the tensor (unlinked
        at once). The runner moves a kept tensor back to the layer's device when it uses it."""
        if self.spill_dir is None:
            return tensor.to("cpu") if self.host_activations and tensor.device.type != "cpu" else tensor
        return self.empty_activation(tensor.shape, tensor.dtype).copy_(tensor)  # a GPU tensor too

    def empty_activation(self, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
        """An uninitialised CPU tensor kept as `keep_activation` keeps one (file-backed when
        spilling), for a pass that fills a large result in place, row by row."""
        if self.spill_dir is None:
            return torch.empty(tuple(shape), dtype=dtype)
        self.spill_dir.mkdir(parents=True, exist_ok=True)
        path = self.spill_dir / f"activation-{self.spilled:07d}.bin"
        self.spilled += 1
        spilled = torch.from_file(str(path), shared=True, size=math.prod(shape), dtype=dtype)
        os.unlink(path)
        return spilled.view(tuple(shape))

    @contextmanager
    def spilling_beyond_budget(self, nbytes: int) -> Iterator[None]:
        """Inside, `keep_activation` spills when a pass will hold `nbytes` of activations, more
        than its budget (the states of every layer for a backward, say), even if the run's two
        buffers fit and do not."""
        if self.spill_dir is not None or nbytes <= self.activation_budget_bytes:
            yield
            return
        self.spill_dir = self.work_dir / "activations"
        try:
            yield
        finally:
            self.spill_dir = None

    @contextmanager
    def outside_resident(self, which: str = "all") -> Iterator[None]:
        """The streamed modules outside the layers in memory: "embeddings", "head" or "all"."""
        head = self.model.get_output_embeddings()
        wanted = [m for m in self.outside.values()
                  if which == "all" or (which == "head") == (m is head)]
        with ExitStack() as stack:
            for module in wanted:
                stack.enter_context(self.resident(module))
            yield

    def save_checkpoint(self, folder: str | Path) -> Path:
        """The current model (removed layers gone, changed layers as changed) as a standard
        sharded safetensors checkpoint with its config, one layer in memory at a time."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        layers = self.layers()
        parts = ["embeddings", "head"] if self.outside else ["all"]  # streamed ones one at a time
        count = len(layers) + len(parts)
        shard = lambda i: f"model-{i:05d}-of-{count:05d}.safetensors"  # noqa: E731
        weight_map: dict[str, str] = {}
        total = 0
        for number, part in enumerate(parts, start=1):
            with self.outside_resident(part):
                outside = {name: t for name, t in outside_layer_tensors(self.model, self.arch).items()
                           if not t.is_meta and name not in weight_map}
                write_shard(folder / shard(number), outside)
                weight_map.update({name: shard(number) for name in outside})
                total += sum(t.numel() * t.element_size() for t in outside.values())
                del outside
        for index, layer in enumerate(tqdm(layers, desc="saving layers", leave=False)):
            number = index + len(parts) + 1
            tensors = {f"{self.arch.layers}.{index}.{name}": read_tensor(loc)
                       for name, loc in self.sources[layer].items()}
            write_shard(folder / shard(number), tensors)
            weight_map.update({name: shard(number) for name in tensors})
            total += sum(t.numel() * t.element_size() for t in tensors.values())
            del tensors
            release_freed_memory()
        write_index(folder, weight_map, total)
        self.model.config.save_pretrained(folder)
        generation = getattr(self.model, "generation_config", None)
        if generation is not None:
            try:
                generation.save_pretrained(folder)
            except Exception as err:  # an invalid generation config does not stop the save
                log.warning("generation config not saved: %s", err)
        return folder

    def changed(self) -> bool:
        """Whether the weights differ from the source checkpoint (a layer written or removed)."""
        return self.writes > 0 or len(self.layers()) != self.source_layers

    def offload_memory_bytes(self) -> int:
        """What offloaded evaluation keeps in memory: embeddings and head plus two layers."""
        outside = sum(loc.nbytes for module in self.outside.values() for loc in self.sources[module].values())
        largest = max((self.layer_bytes(layer) for layer in self.layers()), default=0)
        return outside + 2 * largest

    @property
    def model(self) -> nn.Module:
        model = self._model()
        if model is None:
            raise RuntimeError("the streamed model of this LayerStore was garbage-collected")
        return model

    def close(self) -> None:
        """Remove the work folder (the changed layers; the run saves what it keeps first)."""
        self._remove_work_dir()


def rebuild_rotary(model: nn.Module, arch: Architecture, device: torch.device) -> None:
    """The model-level rotary embedding rebuilt, then moved to `device`: its `inv_freq` buffers are
    computed at construction, not stored, so a skeleton built on meta has none. They are computed
    on the CPU, as a resident model's are (`from_pretrained`, then `.to(device)`): computed on a GPU,
    `base ** (2i / d)` differs in its last bit, which moved every rotary position and flipped
    0.12-0.14% of Wanda's mask entries against the resident run on an H200 (float16 and float32)."""
    if not arch.rotary:
        return
    parent_path, _, attr = arch.rotary.rpartition(".")
    rotary = model.get_submodule(arch.rotary)
    with torch.device("cpu"):
        rebuilt = type(rotary)(config=model.config)
    setattr(model.get_submodule(parent_path), attr, rebuilt.to(device))


def rebuild_embedding_scale(model: nn.Module, arch: Architecture, device: torch.device) -> None:
    """A scaled embedding's factor (Gemma: sqrt(hidden size)), a buffer computed at construction and
    not stored: on a skeleton built on meta it is restored from the module's float copy."""
    if not arch.scaled_embeddings:
        return
    embeddings = model.get_input_embeddings()
    embeddings.embed_scale = torch.tensor(float(embeddings.scalar_embed_scale), device=device)


def streamed_outside_paths(model: nn.Module, arch: Architecture) -> list[str]:
    """Paths of the input embeddings and of the head when it is not tied to them: streamed like
    layers. A tied head shares its weight with the embeddings, and both stay in memory."""
    embeddings, head = model.get_input_embeddings(), model.get_output_embeddings()
    if head is not None and embeddings is not None and head.weight is embeddings.weight:
        return []
    paths = {module: name for name, module in model.named_modules()}
    return [paths[m] for m in (embeddings, head) if m is not None and m in paths]


def outside_layer_tensors(model: nn.Module, arch: Architecture) -> dict[str, torch.Tensor]:
    """Persistent tensors outside the decoder layers (embeddings, final norm, head), as in a
    checkpoint: a head tied to the input embeddings is left out, as `save_pretrained` does."""
    prefix = arch.layers + "."
    head, embeddings = model.get_output_embeddings(), model.get_input_embeddings()
    tied = head is not None and embeddings is not None and head.weight is embeddings.weight
    out = {}
    head_names = {name for name, module in model.named_modules() if module is head}
    for name, tensor in model.state_dict(keep_vars=True).items():
        if name.startswith(prefix):
            continue
        if tied and name.rpartition(".")[0] in head_names:
            continue
        out[name] = tensor.detach()
    return out


def streamed_skeleton(source: str | Path, config, dtype: torch.dtype, device: torch.device,
                      arch: Architecture, work_dir: Path) -> nn.Module:
    """The model with its layers on meta and everything else read from `source`'s shards;
    registered so that `store_of(model)` finds its LayerStore."""
    from transformers import AutoModelForCausalLM

    _prefer_mmap_for_large_buffers()
    with torch.device("meta"):  # nothing allocated (accelerate's init_empty_weights allocates each
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)  # weight, then moves it)
    rebuild_rotary(model, arch, device)
    rebuild_embedding_scale(model, arch, device)
    tensors = model_named(checkpoint_tensors(source), model, source)
    prefix = arch.layers + "."
    expected = {name for name, _ in model.named_parameters(remove_duplicate=False)}
    expected |= {name for name, _ in model.state_dict().items()}
    unexpected = sorted(set(tensors) - expected)
    if unexpected:
        raise ModelCheckError(f"the weights in {source} do not match its config: {len(unexpected)} "
                              f"unexpected ({', '.join(unexpected[:3])}); check config.json")
    tie = lambda: setattr(model.get_output_embeddings(), "weight", model.get_input_embeddings().weight)  # noqa: E731
    tied = getattr(config, "tie_word_embeddings", False) and model.get_output_embeddings() is not None
    if tied:
        tie()  # before: streamed_outside_paths sees the tie; after loading again: the loaded weight
    streamed_prefixes = tuple(path + "." for path in streamed_outside_paths(model, arch)) + (prefix,)
    for name, location in tensors.items():
        if not name.startswith(streamed_prefixes):  # final norm, tied embeddings, OPT's positions
            _set_tensor(model, name, read_tensor(location, device).to(_get_tensor(model, name).dtype))
    if tied:
        tie()
    missing = sorted(name for name, tensor in model.named_parameters()
                     if tensor.is_meta and not name.startswith(streamed_prefixes))
    missing += sorted(name for name, tensor in model.named_buffers()  # computed, not in the checkpoint
                      if tensor.is_meta and not name.startswith(streamed_prefixes))
    missing += sorted(name for name, _ in model.named_parameters()
                      if name.startswith(streamed_prefixes[:-1]) and name not in tensors) if len(
                          streamed_prefixes) > 1 else []
    missing += sorted(name for name, _ in model.named_parameters()
                      if name.startswith(prefix) and name not in tensors)
    if missing:
        raise ModelCheckError(f"the weights in {source} do not match its config: {len(missing)} missing "
                              f"({', '.join(missing[:3])}); check config.json (num_hidden_layers, ...)")
    model.eval()
    _STORES[model] = LayerStore(model, arch, tensors, work_dir, device)
    log.info("streaming %s: %d decoder layers read one at a time from %d tensors", source,
             len(model.get_submodule(arch.layers)), len(tensors))
    return model


def model_named(tensors: dict[str, TensorLocation], model: nn.Module, source) -> dict[str, TensorLocation]:
    """The checkpoint's tensors under the model's names, renamed as `from_pretrained` renames
    them (transformers' conversion mapping: GPT-NeoX's `embed_out` is `lm_head`). A checkpoint
    whose tensors must be converted, not only renamed (fused MoE experts), is refused."""
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import WeightRenaming, rename_source_key

    transforms = get_model_conversion_mapping(model)
    renamings = [t for t in transforms if isinstance(t, WeightRenaming)]
    converters = [t for t in transforms if not isinstance(t, WeightRenaming)]
    meta = model.state_dict()
    out = {}
    for name, location in tensors.items():
        renamed, converted = rename_source_key(name, renamings, converters, model.base_model_prefix, meta)
        if converted is not None:
            raise ModelCheckError(f"{source}: tensor {name} must be converted on loading "
                                  f"({converted}); streaming reads tensors as stored: use model.streaming=false")
        out[renamed] = location
    return out


def checkpoint_description(folder: str | Path) -> dict:
    """Files and total bytes of a checkpoint folder (for logs and records)."""
    tensors = checkpoint_tensors(folder)
    files = sorted({loc.file.name for loc in tensors.values()})
    return {"files": files, "bytes": sum(loc.nbytes for loc in tensors.values()),
            "tensors": len(tensors)}


__all__ = ["LayerStore", "store_of", "streamed_skeleton", "outside_layer_tensors",
           "checkpoint_description", "model_named"]
