"""What pruning buys: the pruned model's inference cost against the dense model's, measured side by
side in one process.

Counted (`evaluation.cost`): parameters (total, non-zero), bytes of the weights, FLOPs of a prefill
of L tokens and of one decode step at context L (PyTorch's FLOP counter on a real forward), KV-cache
bytes per token. Measured (`evaluation.timing`): prefill latency over a (batch, sequence length)
grid and greedy decode throughput with the KV cache, each warmed up, dense and pruned alternated
over repeats, medians and the quartiles of the paired ratios; peak inference memory (CUDA: the
allocator's peak; CPU: resident memory's growth over the weights, after freed heap is returned);
torch threads fixed and recorded. Recovery operators are part of the model they belong to (their
hooks run in every forward), so "6 layers removed + Ghosted" is timed with its boundary matmuls.

Sparse kernels: an unstructured mask runs dense kernels, and the record says so; 2:4 masks on a
CUDA GPU of compute capability 8.0 or more are also timed with PyTorch's semi-structured sparse
linears (`torch.sparse.to_sparse_semi_structured`). A speedup is never estimated: what was not
measured is said in words.

Selected by `evaluation.efficiency` (conf/evaluation/efficiency/default.yaml): `measure: auto`
measures when pruning changes the model's shapes (depth pruning), `always` for every method.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from tqdm.auto import tqdm

from prunelab.errors import ConfigError
from prunelab.evaluation.cost import CountedCost, cache_keyword, count_cost, returned_cache, token_ids
from prunelab.evaluation.metrics import Metric
from prunelab.evaluation.timing import (
    alternated_times, busy_while_timing, fixed_threads, geometric_mean, machine_load, speedup, summary,
)
from prunelab.models.checks import cpu_model
from prunelab.models.memory import current_rss, peak_rss, reset_peak_rss
from prunelab.models.streaming import release_freed_memory

log = logging.getLogger(__name__)

MEASURE = ("auto", "always", "never")
SPARSE_KERNELS = ("auto", "require", "never")
#: What the counted ratios are called in the metrics (pruned / dense; lower is better).
COST_KEYS = ("flops_prefill", "flops_decode", "parameters", "nonzero_parameters", "weight_bytes",
             "kv_bytes_per_token")
COST_METRICS = {"flops_prefill": "cost/flops_prefill", "flops_decode": "cost/flops_decode",
                "parameters": "cost/params", "nonzero_parameters": "cost/nonzero_params",
                "weight_bytes": "cost/weight_bytes", "kv_bytes_per_token": "cost/kv_bytes"}


@dataclass(frozen=True)
class EfficiencySpec:
    """Attributes:
        measure: auto (when pruning changes the model's shapes), always, or never.
        prefill_grid: (batch, sequence length) points of the prefill latency.
        decode_context, decode_batch, new_tokens: greedy decode after a prompt of decode_context
            tokens, new_tokens steps with the KV cache; FLOPs are counted at decode_context.
        repeats, warmup: timed and untimed runs of each model at each point.
        threads: torch threads during the timing (None: the run's); one gives the steadiest ratios.
        sparse_kernels: auto (time 2:4 masks with semi-structured kernels where the GPU has them),
            require (refuse a run where it has not), never.
    """

    measure: str = "auto"
    prefill_grid: tuple[tuple[int, int], ...] = ((1, 128), (1, 256), (4, 128))
    decode_context: int = 128
    decode_batch: int = 1
    new_tokens: int = 32
    repeats: int = 5
    warmup: int = 1
    threads: int | None = 1
    sparse_kernels: str = "auto"

    def __post_init__(self) -> None:
        try:
            grid = tuple((int(b), int(t)) for b, t in self.prefill_grid)
        except (TypeError, ValueError):
            raise ConfigError(f"evaluation.efficiency.prefill_grid={self.prefill_grid!r}: give [batch, "
                              "seqlen] pairs, e.g. [[1, 128], [4, 128]]") from None
        object.__setattr__(self, "prefill_grid", grid)
        if self.measure not in MEASURE:
            raise ConfigError(f"evaluation.efficiency.measure={self.measure!r}: use {', '.join(MEASURE)}")
        if self.sparse_kernels not in SPARSE_KERNELS:
            raise ConfigError(f"evaluation.efficiency.sparse_kernels={self.sparse_kernels!r}: use "
                              f"{', '.join(SPARSE_KERNELS)}")
        numbers = [n for point in self.prefill_grid for n in point] + [
            self.decode_context, self.decode_batch, self.new_tokens, self.repeats]
        if not self.prefill_grid or min(numbers) < 1 or self.warmup < 0 or (self.threads or 1) < 1:
            raise ConfigError("evaluation.efficiency needs a non-empty prefill_grid of positive (batch, "
                              "seqlen), positive decode sizes and repeats, warmup >= 0, threads >= 1")

    def wanted(self, changes_shapes: bool) -> bool:
        return self.measure == "always" or (self.measure == "auto" and changes_shapes)

    @property
    def longest(self) -> int:
        return max(max(t for _, t in self.prefill_grid), self.decode_context + self.new_tokens)

    def check(self, model: nn.Module, device: torch.device, sparsity_type: str | None,
              free_bytes: int | None, spare_bytes: int) -> None:
        """One line before any work: a grid past the model's positions, a batch that cannot fit
        beside the two models (`free_bytes` of the device, `spare_bytes` the dense copy's weights),
        2:4 kernels required where there are none."""
        positions = getattr(model.config, "max_position_embeddings", None)
        if positions and self.longest > positions:
            raise ConfigError(f"evaluation.efficiency: sequences of {self.longest} tokens exceed the model's "
                              f"max_position_embeddings={positions}; shorten prefill_grid or decode_context")
        need = spare_bytes + activation_bytes(model.config, self)
        if free_bytes is not None and need > free_bytes:
            raise ConfigError(f"evaluation.efficiency: its largest batch needs about {need / 2**30:.2f} GiB "
                              f"(a dense copy and activations) but {free_bytes / 2**30:.2f} GiB are free on "
                              f"{device}; use smaller prefill_grid batches or measure=never")
        usable, reason = sparse_kernels_usable(device, sparsity_type)
        if self.sparse_kernels == "require" and not usable:
            raise ConfigError(f"evaluation.efficiency.sparse_kernels=require: {reason}")


def activation_bytes(config: Any, spec: EfficiencySpec) -> int:
    """A generous bound on one timed forward's working memory: fp32 logits of the largest grid
    point, ten hidden-size activations per token, and its KV cache."""
    tokens = max(b * t for b, t in spec.prefill_grid + ((spec.decode_batch, spec.longest),))
    hidden, vocab = config.hidden_size, config.vocab_size
    layers = getattr(config, "num_hidden_layers", 1)
    return tokens * 4 * (vocab + 10 * hidden + 2 * layers * hidden)


def sparse_kernels_usable(device: torch.device, sparsity_type: str | None) -> tuple[bool, str]:
    """Whether PyTorch's semi-structured (2:4) sparse kernels can time this model, and why not."""
    if sparsity_type != "2:4":
        kind = "unstructured" if sparsity_type in (None, "unstructured") else sparsity_type
        return False, (f"no sparse kernel: PyTorch has none for {kind} sparsity, so the pruned model "
                       "runs the same dense kernels as the dense one" if sparsity_type else
                       "no sparse kernel: the pruning changes shapes, not sparsity")
    if device.type != "cuda":
        return False, f"not measured: 2:4 semi-structured kernels need a CUDA GPU (compute capability >= 8.0), not {device.type}"
    major, minor = torch.cuda.get_device_capability(device)
    if major < 8:
        return False, f"not measured: 2:4 semi-structured kernels need compute capability >= 8.0, this GPU has {major}.{minor}"
    return True, "2:4 linears converted with torch.sparse.to_sparse_semi_structured"


def device_description(device: torch.device) -> dict[str, Any]:
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return {"device": str(device), "device_name": props.name, "memory_bytes": props.total_memory}
    return {"device": str(device), "device_name": cpu_model()}


def prefill_work(model: nn.Module, batch: int, length: int) -> Callable[[], Callable[[], Any]]:
    ids = token_ids(model, batch, length)  # [B, T]
    return lambda: (lambda: model(ids, use_cache=False))


def decode_work(model: nn.Module, batch: int, context: int, new_tokens: int) -> Callable[[], Callable[[], Any]]:
    """Untimed: a prompt of `context` tokens through the model; timed: `new_tokens` greedy steps."""
    ids, keyword = token_ids(model, batch, context), cache_keyword(model)  # [B, L]

    def prepare() -> Callable[[], Any]:
        output = model(ids, use_cache=True)
        state = {"cache": returned_cache(output), "token": output.logits[:, -1:].argmax(-1)}  # [B, 1]

        def steps() -> None:
            for _ in range(new_tokens):
                step = model(state["token"], use_cache=True, **{keyword: state["cache"]})
                state["cache"], state["token"] = returned_cache(step), step.logits[:, -1:].argmax(-1)
        return steps
    return prepare


def inference_peak_bytes(works: list[Callable[[], Callable[[], Any]]], device: torch.device,
                         weight_bytes: int) -> int:
    """The weights plus the most memory the works (prepared, then run) needed beyond them."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        for prepare in works:
            prepare()()
        torch.cuda.synchronize(device)
        return weight_bytes + max(torch.cuda.max_memory_allocated(device) - base, 0)
    release_freed_memory()
    base = current_rss()
    reset_peak_rss()
    for prepare in works:
        prepare()()
    return weight_bytes + max(peak_rss() - base, 0)


def semi_structured_copy(model: nn.Module) -> nn.Module:
    """A copy of the model whose 2:4 linears hold semi-structured sparse weights (CUDA only)."""
    from torch.sparse import to_sparse_semi_structured

    sparse = copy.deepcopy(model)
    for module in sparse.modules():
        if isinstance(module, nn.Linear) and module.weight.dim() == 2 and module.weight.shape[0] % 64 == 0:
            module.weight = nn.Parameter(to_sparse_semi_structured(module.weight.detach()), requires_grad=False)
    return sparse


@dataclass
class EfficiencyMeasurement:
    """Measures a dense and a pruned model side by side; `dense_cost` is counted before pruning."""

    spec: EfficiencySpec
    device: torch.device
    sparsity_type: str | None
    dense_cost: CountedCost
    progress: bool = False  # a bar over the grid points and the decode (a minute or more on a real model)
    section: dict[str, Any] = field(default_factory=dict)

    @torch.inference_mode()
    def measure(self, dense: nn.Module, pruned: nn.Module) -> dict[str, Any]:
        spec, device = self.spec, self.device
        pruned_cost = count_cost(pruned, spec.decode_context)
        ratios = {k: getattr(pruned_cost, k) / getattr(self.dense_cost, k) for k in COST_KEYS}
        models = {"dense": dense, "pruned": pruned}
        usable, reason = sparse_kernels_usable(device, self.sparsity_type)
        if usable and spec.sparse_kernels == "never":
            reason = "not measured: evaluation.efficiency.sparse_kernels=never"
        elif usable:
            try:
                models["pruned_sparse_kernels"] = semi_structured_copy(pruned)
            except (RuntimeError, ValueError, TypeError) as err:  # e.g. a dtype the kernels lack
                if spec.sparse_kernels == "require":
                    raise
                reason = f"not measured: to_sparse_semi_structured refused this model ({str(err).splitlines()[0]})"
        load_before = machine_load()
        with fixed_threads(spec.threads if device.type == "cpu" else None) as threads:
            points = tqdm(spec.prefill_grid, desc="efficiency: prefill grid", disable=not self.progress, leave=False)
            grid = [self._point(models, prefill_work, (b, t), {"batch": b, "seqlen": t}) for b, t in points]
            decode = self._point(models, decode_work, (spec.decode_batch, spec.decode_context, spec.new_tokens),
                                 {"batch": spec.decode_batch, "context": spec.decode_context,
                                  "new_tokens": spec.new_tokens})
            largest = max(spec.prefill_grid, key=lambda p: p[0] * p[1])
            peaks = {name: inference_peak_bytes(
                [prefill_work(model, *largest),
                 decode_work(model, spec.decode_batch, spec.decode_context, spec.new_tokens)],
                device, (self.dense_cost if name == "dense" else pruned_cost).weight_bytes)
                for name, model in (("dense", dense), ("pruned", pruned))}
        load = busy_while_timing(load_before, machine_load())
        if load["busy"] and device.type == "cpu":
            log.warning("the machine was busy while timing (load average %s on %s CPUs): the measured "
                        "speedups are less trustworthy than on a quiet machine", max(
                            v for v in (load["load_average_before"], load["load_average_after"]) if v is not None),
                        load["cpus"])
        tokens = spec.decode_batch * spec.new_tokens
        for name in models:
            decode[name]["tokens_per_s"] = tokens / decode[name]["median_s"]
        self.section = {
            "protocol": {**device_description(device), "threads": threads, "dtype": str(next(pruned.parameters()).dtype).removeprefix("torch."),
                         "torch": torch.__version__, "prefill_grid": [list(p) for p in spec.prefill_grid],
                         "decode": {"batch": spec.decode_batch, "context": spec.decode_context,
                                    "new_tokens": spec.new_tokens},
                         "repeats": spec.repeats, "warmup": spec.warmup, "flops_context": spec.decode_context,
                         "machine_load": load},
            "counted": {"dense": self.dense_cost.to_dict(), "pruned": pruned_cost.to_dict(), "ratio": ratios},
            "prefill": grid, "decode": decode,
            "peak_memory": {**{f"{n}_bytes": v for n, v in peaks.items()}, "ratio": peaks["pruned"] / peaks["dense"],
                            "what": "the CUDA allocator's peak" if device.type == "cuda" else
                                    "resident memory's growth over the weights, after freed heap is returned"},
            "speedup": {"prefill": geometric_mean([p["speedup"] for p in grid]), "decode": decode["speedup"]},
            "sparse_kernels": {"used": "pruned_sparse_kernels" in models, "reason": reason},
        }
        if "pruned_sparse_kernels" in models:
            self.section["speedup"]["prefill_sparse_kernels"] = geometric_mean(
                [p["sparse_kernels_speedup"] for p in grid])
        return self.section

    def _point(self, models: dict[str, nn.Module], work, args: tuple, where: dict[str, Any]) -> dict[str, Any]:
        prepared = {name: work(model, *args) for name, model in models.items()}
        times = alternated_times(prepared, self.device, self.spec.repeats, self.spec.warmup)
        point = {**where, **{name: summary(t) for name, t in times.items()},
                 **speedup(times["dense"], times["pruned"])}
        if "pruned_sparse_kernels" in times:
            point["sparse_kernels_speedup"] = speedup(times["dense"], times["pruned_sparse_kernels"])["speedup"]
        return point

    def metrics(self) -> dict[str, Metric]:
        """speedup/prefill, speedup/decode (higher is better) and cost/* ratios to dense (lower)."""
        section = self.section
        stamp = {"kind": "efficiency", **{k: v for k, v in section["protocol"].items()
                                          if k not in ("torch", "machine_load")}}
        out = {"speedup/prefill": Metric(section["speedup"]["prefill"], True, stamp),
               "speedup/decode": Metric(section["speedup"]["decode"], True, stamp)}
        for key, name in COST_METRICS.items():
            out[name] = Metric(section["counted"]["ratio"][key], False, stamp)
        out["cost/peak_memory"] = Metric(section["peak_memory"]["ratio"], False, stamp)
        return out

