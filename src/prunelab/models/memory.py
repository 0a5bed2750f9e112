"""How much memory a run needs, resident or streamed, against the budget it has.

Estimated per layer, not per model: a streamed model holds the final norm (and embeddings tied to
the head) throughout, and reads one module at a time: the embeddings while the calibration enters
layer 0, one decoder layer while a pass visits it, an untied head while logits are taken; beside
it, two activation buffers (the calibration set entering and leaving the current layer) and the
method's per-layer state (SparseGPT's Hessian and its inverse; the mask's sort buffers). A
resident run holds every weight instead. The shapes
come from the config on the meta device: nothing is allocated to estimate. When the activations
do not fit beside the layer, a streamed run spills them to file-backed mappings
(`LayerStore.keep_activation`) and keeps one batch in memory. A method that back-propagates
(`layer_gradients`) also holds, for one batch, what autograd saves for the backward and float32
gradient sums of the weights it asks for: one layer's when streamed, every layer's (and the head's
graph) when resident (`backward_graph_bytes`, `gradient_bytes_per_weight`).

The budget is `runtime.memory_budget_gb` when set, else what this process may use: the smallest of
its data limit (`ulimit -d`, `prlimit --data`), its cgroup's memory limit (a SLURM job's `--mem`)
and the machine's available memory plus what the process holds already.
"""

from __future__ import annotations

import resource
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from prunelab.errors import ModelCheckError
from prunelab.models.checks import free_bytes

GIB = 1024**3
#: Bytes per weight the unstructured mask's sort needs (scores, |W|, sorted values, indices, mask).
MASK_BYTES_PER_WEIGHT = 21
#: Rows of a row-group mask computed at once (`pruning.masks`): its sort buffers are then those of
#: ROW_CHUNK_ENTRIES weights, not of the whole matrix (a streamed 70B layer's MLP). A memory
#: bound, so it is set here, beside the estimate that counts on it.
ROW_CHUNK_ENTRIES = 1 << 22


def gib(value: float) -> str:
    return f"{value / GIB:.2f} GiB"


def readable_bytes(value: float) -> str:
    """GiB from 1 GiB up, MiB below (a small model's folder is not "0.00 GiB")."""
    return gib(value) if value >= GIB else f"{value / 1024**2:.1f} MiB"


def process_status_bytes(field: str) -> int | None:
    """A memory field of /proc/self/status (VmRSS, RssAnon, VmData, VmHWM) in bytes; None off Linux."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def reset_peak_rss() -> bool:
    """Reset this process's peak resident memory (Linux: /proc/self/clear_refs), so the next
    `peak_rss` is the peak since now; False where that cannot be done."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def peak_rss() -> int:
    """Peak resident memory (bytes) since the last `reset_peak_rss`, or since the start."""
    peak = process_status_bytes("VmHWM")
    return peak if peak is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def synchronize(device: torch.device | None) -> None:
    """Wait for the device's queued kernels (CUDA launches return at once): before a clock is read
    or a peak taken, so that a stage's time and memory are its own. A no-op on the CPU."""
    if device is not None and device.type == "cuda":
        torch.cuda.synchronize(device)


def reset_peak_device_memory(device: torch.device | None) -> None:
    """Start a new peak of the CUDA allocator on `device` (without it, every stage would report
    the run's peak so far). A no-op on the CPU, whose peak is `reset_peak_rss`'s."""
    if device is not None and device.type == "cuda":
        synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)


def peak_device_memory(device: torch.device | None) -> int | None:
    """Bytes the CUDA allocator held at most on `device` since `reset_peak_device_memory`; None
    on the CPU."""
    if device is None or device.type != "cuda":
        return None
    synchronize(device)
    return int(torch.cuda.max_memory_allocated(device))


def current_rss(anonymous: bool = False) -> int:
    """Resident memory of this process now (bytes); `anonymous`: only its private memory
    (RssAnon), what a data limit or a cgroup charges, without the pages of shared libraries."""
    value = process_status_bytes("RssAnon" if anonymous else "VmRSS")
    return value if value is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _cgroup_limit() -> int | None:
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 1 << 60:
            return int(text)
    return None


def detected_budget() -> tuple[int | None, str]:
    """(bytes this process may use in all, where that limit comes from), or (None, ...)."""
    limits: list[tuple[int, str]] = []
    soft, _ = resource.getrlimit(resource.RLIMIT_DATA)
    if soft != resource.RLIM_INFINITY:
        limits.append((soft, "the data limit (ulimit -d)"))
    cgroup = _cgroup_limit()
    if cgroup is not None:
        limits.append((cgroup, "the cgroup memory limit"))
    available = free_bytes(torch.device("cpu"))  # MemAvailable
    if available is not None:
        limits.append((available + current_rss(), "the available memory"))
    if not limits:
        return None, "unknown"
    return min(limits)


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes a run holds at its peak, by part (see the module docstring)."""

    whole_model: int  # every weight
    outside_layers: int  # what stays in memory outside the layers (final norm; tied embeddings)
    largest_layer: int  # one decoder layer
    largest_streamed: int  # the largest module read at a time: a layer, the embeddings or the head
    activations: int  # calibration (or evaluation) hidden states: two buffers
    method_state: int  # the method's per-layer state at its largest linear
    baseline: int  # the process's private memory before loading (`private_memory`)

    @property
    def resident(self) -> int:
        return self.whole_model + self.activations + self.method_state + self.baseline + self.backward_resident

    @property
    def streamed(self) -> int:
        return (self.outside_layers + self.largest_streamed + self.activations + self.method_state
                + self.baseline)

    activation_batch: int = 0  # one batch entering and leaving a layer (what remains when spilled)
    decoder_layers: int = 0  # every decoder layer: what a streamed run rewrites at most
    num_layers: int = 0
    backward_resident: int = 0  # a whole-model backward beyond one layer's: the other layers' graphs and gradients

    @property
    def streamed_spilled(self) -> int:
        """The streamed peak with the activations in file-backed mappings: one batch in memory."""
        return self.streamed - self.activations + self.activation_batch

    def as_dict(self) -> dict[str, int]:
        parts = {name: value for name, value in asdict(self).items() if name != "num_layers"}  # bytes only
        return {**parts, "resident": self.resident, "streamed": self.streamed,
                "streamed_spilled": self.streamed_spilled}


@dataclass(frozen=True)
class ModelSizes:
    """Bytes of a model's parts, from its config on the meta device."""

    whole: int
    resident_outside: int  # outside the layers and never streamed (final norm, tied embeddings)
    largest_layer: int
    largest_outside: int  # the larger of the streamed embeddings and head (0 when tied)
    linears: list[tuple[int, int]]  # [out, in] of the largest layer's linears
    decoder_layers: int = 0  # all decoder layers
    num_layers: int = 0


def model_sizes(config, dtype: torch.dtype) -> ModelSizes:
    from transformers import AutoModelForCausalLM

    from prunelab.models.architectures import architecture_for
    from prunelab.models.streaming import streamed_outside_paths

    arch = architecture_for(config.model_type)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    if getattr(config, "tie_word_embeddings", False) and model.get_output_embeddings() is not None:
        model.get_output_embeddings().weight = model.get_input_embeddings().weight
    layers = model.get_submodule(arch.layers)
    size = torch.empty((), dtype=dtype).element_size()
    whole = sum(p.numel() for p in model.parameters()) * size
    per_layer = [sum(p.numel() for p in layer.parameters()) * size for layer in layers]
    streamed = [sum(p.numel() for p in model.get_submodule(path).parameters()) * size
                for path in streamed_outside_paths(model, arch)]
    largest = max(range(len(per_layer)), key=per_layer.__getitem__) if per_layer else None
    linears = [tuple(m.weight.shape) for m in layers[largest].modules()
               if isinstance(m, torch.nn.Linear)] if largest is not None else []
    return ModelSizes(whole, whole - sum(per_layer) - sum(streamed), max(per_layer, default=0),
                      max(streamed, default=0), linears, sum(per_layer), len(per_layer))


def private_memory() -> int:
    """What this process holds that counts against its limit: its data segment (VmData) under a
    data limit, else its private resident memory (RssAnon)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_DATA)
    data = process_status_bytes("VmData") if soft != resource.RLIM_INFINITY else None
    return data if data is not None else current_rss(anonymous=True)


def default_state_bytes(out_features: int, in_features: int) -> int:
    """Scores, threshold copy and mask of one linear (9 bytes a weight), and the sort buffers of
    one chunk of rows (ROW_CHUNK_ENTRIES): magnitude, Wanda."""
    weights = out_features * in_features
    return 9 * weights + (MASK_BYTES_PER_WEIGHT - 5) * min(weights, ROW_CHUNK_ENTRIES)


def gradient_bytes_per_weight(dtype: torch.dtype) -> int:
    """Bytes a back-propagating method holds per weight it asks gradients of: the float32 sum over
    batches (`calibration.gradients.GradientSums`; in float32 the first batch's `.grad` becomes
    it), plus, in float16, the batch's scaled `.grad`, kept until the batch is known finite."""
    return 4 + (torch.empty((), dtype=dtype).element_size() if dtype == torch.float16 else 0)


def backward_graph_bytes(config, dtype: torch.dtype, tokens: int) -> tuple[int, int]:
    """(one decoder layer's, the LM head's) tensors autograd saves for the backward of `tokens`
    tokens, for a LLaMA-style layer with SDPA attention (the `from_pretrained` default; eager
    attention's [heads, T, T] probabilities are not counted). Per token, from the tensors saved by
    such layers (counted with `torch.autograd.graph.saved_tensors_hooks`, checked in
    tests/test_streaming.py): about 8 hidden + 4 intermediate + 2 key/value values in the model's
    dtype and the two norms' float32 inputs; the head keeps the logits in the dtype and the loss's
    float32 log-probabilities."""
    size = torch.empty((), dtype=dtype).element_size()
    hidden = int(config.hidden_size)
    intermediate = int(getattr(config, "intermediate_size", None) or getattr(config, "ffn_dim", None)
                       or 4 * hidden)
    heads = int(getattr(config, "num_attention_heads", 1) or 1)
    kv_dim = int(getattr(config, "num_key_value_heads", None) or heads) * (hidden // heads)
    layer = size * (8 * hidden + 4 * intermediate + 2 * kv_dim) + 4 * 2 * hidden
    head = int(config.vocab_size) * (size + 4) + 4 * hidden
    return tokens * layer, tokens * head


def estimate(config, dtype: torch.dtype, activation_tokens: int,
             state_bytes: Callable[[int, int], int] = default_state_bytes,
             batch_tokens: int | None = None, layer_gradients: bool = False) -> MemoryEstimate:
    """The run's peak by part; `activation_tokens` is calibration sequences x length (or the
    evaluation's, whichever is larger); `state_bytes(out, in)` the method's state for one linear;
    `layer_gradients`: the method back-propagates one batch (`batch_tokens`) at a time and sums
    the gradients of the decoder layers' linear weights: one layer's graph and gradients when
    streamed (or the head's graph, whichever is larger), every layer's and the head's when resident
    (`backward_resident`)."""
    sizes = model_sizes(config, dtype)
    hidden = int(config.hidden_size)
    size = torch.empty((), dtype=dtype).element_size()
    activations = 2 * activation_tokens * hidden * size  # the layer's inputs and outputs
    batch = 2 * (batch_tokens or activation_tokens) * hidden * size
    state = max((state_bytes(o, i) for o, i in sizes.linears), default=0)
    backward_resident = 0
    if layer_gradients:
        gradients = sum(o * i for o, i in sizes.linears) * gradient_bytes_per_weight(dtype)  # one layer
        layer_graph, head_graph = backward_graph_bytes(config, dtype, batch_tokens or activation_tokens)
        state += gradients + max(layer_graph, head_graph)
        whole = sizes.num_layers * (gradients + layer_graph) + head_graph
        backward_resident = max(whole - gradients - max(layer_graph, head_graph), 0)
    return MemoryEstimate(sizes.whole, sizes.resident_outside, sizes.largest_layer,
                          max(sizes.largest_layer, sizes.largest_outside), activations, state,
                          private_memory(), min(batch, activations), sizes.decoder_layers, sizes.num_layers,
                          backward_resident)


def choose_mode(streaming: bool | str, need: MemoryEstimate, budget: int | None, budget_source: str
                ) -> tuple[str, bool]:
    """("resident" | "streamed", whether the activations spill to disk) for `model.streaming`
    (true | false | auto) under the budget. A streamed run whose activations do not fit beside the
    layer spills them; a run that cannot fit even then is refused here, in one line, before any
    work."""
    mode = ("streamed" if streaming is True else "resident" if streaming is False
            else "streamed" if budget is not None and need.resident > budget else "resident")
    if budget is None:
        return mode, False
    if mode == "resident":
        if need.resident <= budget:
            return mode, False
        if need.streamed_spilled <= budget:
            raise ModelCheckError(f"the model needs about {gib(need.resident)} in memory but the budget is "
                                  f"{gib(budget)} ({budget_source}); model.streaming=true (or auto) reads one "
                                  f"decoder layer at a time and needs about "
                                  f"{gib(need.streamed if need.streamed <= budget else need.streamed_spilled)}")
    elif need.streamed <= budget:
        return mode, False
    elif need.streamed_spilled <= budget:
        return mode, True
    parts = (f"the largest module read at once {gib(need.largest_streamed)} + the rest outside the "
             f"layers {gib(need.outside_layers)} + one batch of activations {gib(need.activation_batch)} "
             f"+ method state {gib(need.method_state)} + process {gib(need.baseline)}")
    raise ModelCheckError(f"even streamed, this run needs about {gib(need.streamed_spilled)} ({parts}) but "
                          f"the budget is {gib(budget)} ({budget_source}); use a smaller calibration batch "
                          f"(runtime.calibration_batch_size), a smaller dtype, or more memory")


def streamed_disk_bytes(need: MemoryEstimate, spill: bool, layer_gradients: bool = False,
                        forward_checkpoint: bool = False, rewrites_layers: bool = True) -> dict[str, int]:
    """What a streamed run may write to its work folder, by part, at most (they are added up):
    - changed_layers: every decoder layer rewritten (width pruning changes them all; depth pruning
      without a recovery removes layers and rewrites none: `rewrites_layers=False`);
    - spilled_activations: the two calibration buffers, when they do not fit beside the layer;
    - backward_inputs: every layer's input kept by a back-propagating method (L + 1 buffers);
    - forward_checkpoint: a zero-shot evaluation's checkpoint of the current model
      (`models.offload`; accelerate's disk offload then reads its safetensors shards in place).
    The pruned model a run saves (`save_model`) goes to its output folder and is not counted."""
    buffer = need.activations // 2
    return {"changed_layers": need.decoder_layers if rewrites_layers else 0,
            "spilled_activations": need.activations if spill else 0,
            "backward_inputs": (need.num_layers + 1) * buffer if layer_gradients else 0,
            "forward_checkpoint": need.whole_model if forward_checkpoint else 0}


def check_disk(parts: dict[str, int], folder: Path) -> None:
    """Refuse, in one line and before any work, a streamed run whose work folder's disk cannot
    hold what it may write (`streamed_disk_bytes`): hours into a 70B run is too late to learn it."""
    existing = Path(folder)
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    try:
        free = shutil.disk_usage(existing).free
    except OSError:
        return
    need = sum(parts.values())
    if need > free:
        listed = ", ".join(f"{name.replace('_', ' ')} {readable_bytes(value)}" for name, value in parts.items()
                           if value)
        raise ModelCheckError(f"a streamed run may write up to {readable_bytes(need)} to {folder} ({listed}) but "
                              f"{readable_bytes(free)} are free there; run from a folder on a larger disk (hydra.run.dir; "
                              "the Python API writes to its cache folder or TMPDIR)")
