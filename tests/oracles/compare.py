"""Run a prunelab method and its oracle on two copies of the same model and compare the masks.

The one module of `oracles` that imports prunelab: the oracles themselves (`oracles.magnitude`,
`oracles.wanda`, `oracles.sparsegpt`) do not. prunelab's side is built the way the pipeline does
it (a `PruneContext` over a `LoadedModel`, then `method.allocate(ctx)` and
`method.prune(ctx, targets)`); the oracle's side prunes its copy with the same calibration token
ids. The mask of a weight matrix is its zero pattern (weight == 0), compared entry by entry, per
decoder layer.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

import prunelab.pruning  # noqa: F401  first: prunelab.allocation first hits an import cycle
from prunelab.cli import model_preset
from prunelab.context import PruneContext
from prunelab.data import CalibrationSpec, calibration_samples
from prunelab.models import load_model, wrap_model
from prunelab.models.adapter import ModelAdapter
from prunelab.pruning.dsnot import DSnoT
from prunelab.pruning.magnitude import Magnitude
from prunelab.pruning.ria import RIA
from prunelab.pruning.sparsegpt import SparseGPT
from prunelab.pruning.wanda import Wanda

from oracles import ORACLES
from oracles.llama_layers import decoder_linears

REFINE_SETTINGS = ("max_cycles", "update_threshold", "pow_of_var", "same_sign", "skip")


def wanda_dsnot(**settings: Any) -> Wanda:
    """`pruning=wanda pruning/refine=dsnot`: the refinement's settings go to DSnoT, the rest to Wanda."""
    refine = DSnoT(**{k: settings.pop(k) for k in REFINE_SETTINGS if k in settings})
    return Wanda(refine=refine, **settings)


METHODS = {"magnitude": Magnitude, "wanda": Wanda, "sparsegpt": SparseGPT, "ria": RIA, "dsnot": wanda_dsnot}
SMOLLM2_CACHE = Path.home() / ".cache" / "prunelab"  # where the GGUF is converted once


def load_smollm2(cache_dir: Path | None = SMOLLM2_CACHE):
    """SmolLM2-135M as the project loads it (model preset `smollm2_135m`, on the CPU).

    `cache_dir` defaults to the user's prunelab cache, not the test session's private one: the
    conversion folder is named by the GGUF's content, so sharing it across sessions is safe and the
    ~20 s conversion happens once per machine."""
    return load_model(model_preset("smollm2_135m", device="cpu"), cache_dir=cache_dir)


def with_model(loaded, model: nn.Module):
    """A LoadedModel over another model object, with its own adapter (which reads the layers
    from that model)."""
    adapter = ModelAdapter(model, loaded.adapter.arch)
    return dataclasses.replace(loaded, model=model, adapter=adapter)


def truncated(loaded, num_layers: int):
    """A LoadedModel of a deep copy of the model with only its first `num_layers` decoder layers
    (`config.num_hidden_layers` set to match); the original is left as it was."""
    model = loaded.model
    layers, saved = model.model.layers, model.config.num_hidden_layers
    model.model.layers = nn.ModuleList(list(layers)[:num_layers])
    model.config.num_hidden_layers = num_layers
    try:
        short = copy.deepcopy(model)
    finally:
        model.model.layers, model.config.num_hidden_layers = layers, saved
    return with_model(loaded, short)


def plain_loaded(folder: str | Path, num_layers: int | None = None):
    """A LoadedModel over `AutoModelForCausalLM.from_pretrained(folder)` with nothing set, as a
    user's script loads it, its first `num_layers` decoder layers kept in place: no deep copy, so
    its weights stay where transformers put them (a deep copy moves them to fresh allocations)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(folder)
    if num_layers is not None:
        model.model.layers = nn.ModuleList(list(model.model.layers)[:num_layers])
        model.config.num_hidden_layers = num_layers
    return wrap_model(model, AutoTokenizer.from_pretrained(folder))


def realtext_calibration(tokenizer, nsamples: int, seqlen: int, seed: int = 0) -> torch.Tensor:
    """[nsamples, seqlen] token ids of the realtext corpus (Shakespeare and Python's docs)."""
    return calibration_samples(CalibrationSpec(source="realtext", nsamples=nsamples, seqlen=seqlen),
                               tokenizer, seed=seed)


def parse_nm(sparsity_type: str) -> tuple[int, int] | None:
    if sparsity_type == "unstructured":
        return None
    n, m = sparsity_type.split(":")
    return int(n), int(m)


def prunelab_method(method: str, sparsity: float, sparsity_type: str, **switches: Any):
    """prunelab's method with its defaults plus `switches` (e.g. ties="exact")."""
    return METHODS[method](sparsity=sparsity, sparsity_type=sparsity_type, **switches)


def run_prunelab(loaded, method, token_ids: torch.Tensor) -> float:
    """Prune loaded.model in place as the pipeline does; wall seconds of allocate + prune."""
    ctx = PruneContext(loaded, 0, lambda: token_ids, progress=False)
    start = time.perf_counter()
    targets = method.allocate(ctx)
    method.prune(ctx, targets)
    return time.perf_counter() - start


def run_oracle(model: nn.Module, method: str, token_ids: torch.Tensor, sparsity: float,
               sparsity_type: str, **switches: Any) -> float:
    """Prune `model` in place with the oracle; wall seconds."""
    start = time.perf_counter()
    ORACLES[method](model, token_ids, sparsity=sparsity, nm=parse_nm(sparsity_type), **switches)
    return time.perf_counter() - start


def layer_weights(model: nn.Module) -> list[dict[str, torch.Tensor]]:
    """Per decoder layer, name -> a detached copy of each linear's weight."""
    return [{name: linear.weight.detach().clone()
             for name, linear in decoder_linears(layer).items()} for layer in model.model.layers]


def compact_ranges(indices: Sequence[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> "0-2,5,7-8"; "" when empty."""
    parts, run = [], []
    for i in sorted(indices):
        if run and i == run[-1] + 1:
            run.append(i)
            continue
        if run:
            parts.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
        run = [i]
    if run:
        parts.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
    return ",".join(parts)


@dataclass
class Comparison:
    """prunelab against the oracle for one method and setting."""

    method: str
    sparsity: float
    sparsity_type: str
    setting: str
    differing_per_layer: list[int]
    entries_per_layer: list[int]
    max_abs_weight_diff: float
    pruned_fraction_prunelab: float
    pruned_fraction_oracle: float
    seconds_prunelab: float = float("nan")
    seconds_oracle: float = float("nan")
    per_linear: dict[str, int] = field(default_factory=dict)  # "layers.i.name" -> differing entries

    @property
    def differing(self) -> int:
        return sum(self.differing_per_layer)

    @property
    def entries(self) -> int:
        return sum(self.entries_per_layer)

    @property
    def fraction(self) -> float:
        return self.differing / self.entries

    @property
    def layers_with_differences(self) -> str:
        return compact_ranges([i for i, d in enumerate(self.differing_per_layer) if d])

    def row(self) -> dict[str, Any]:
        return {"method": self.method,
                "sparsity": f"{self.sparsity:.0%}" if self.sparsity_type == "unstructured" else self.sparsity_type,
                "setting": self.setting, "differing_entries": self.differing,
                "total_entries": self.entries, "fraction": self.fraction,
                "layers_with_differences": self.layers_with_differences or "none",
                "max_abs_dW": self.max_abs_weight_diff if self.method == "sparsegpt" else None,
                "pruned_prunelab": self.pruned_fraction_prunelab,
                "pruned_oracle": self.pruned_fraction_oracle,
                "seconds_prunelab": self.seconds_prunelab, "seconds_oracle": self.seconds_oracle}


def compare_weights(prunelab_weights: list[dict[str, torch.Tensor]],
                    oracle_weights: list[dict[str, torch.Tensor]], **labels: Any) -> Comparison:
    """Differing zero-pattern entries per layer and the max |W_prunelab - W_oracle|."""
    differing, entries, per_linear = [], [], {}
    max_diff, zeros_a, zeros_b = 0.0, 0, 0
    for index, (ours, theirs) in enumerate(zip(prunelab_weights, oracle_weights, strict=True)):
        layer_diff = layer_entries = 0
        for name in ours:
            a, b = ours[name].float(), theirs[name].float()
            count = int(((a == 0) != (b == 0)).sum())
            per_linear[f"layers.{index}.{name}"] = count
            layer_diff += count
            layer_entries += a.numel()
            zeros_a += int((a == 0).sum())
            zeros_b += int((b == 0).sum())
            max_diff = max(max_diff, float((a - b).abs().max()))
        differing.append(layer_diff)
        entries.append(layer_entries)
    total = sum(entries)
    return Comparison(differing_per_layer=differing, entries_per_layer=entries,
                      max_abs_weight_diff=max_diff, pruned_fraction_prunelab=zeros_a / total,
                      pruned_fraction_oracle=zeros_b / total, per_linear=per_linear, **labels)


def setting_label(switches: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in switches.items()) or "defaults"


@dataclass
class OracleRun:
    """The oracle's pruned weights for one method and sparsity (reused across prunelab's
    settings: the oracle has none)."""

    weights: list[dict[str, torch.Tensor]]
    seconds: float


def oracle_run(loaded, method: str, token_ids: torch.Tensor, sparsity: float, sparsity_type: str,
               fresh: Callable[[], Any] | None = None, **oracle_switches: Any) -> OracleRun:
    """Prune a copy of loaded.model with the oracle (or, with `fresh`, a new load of the same
    model); the original is not changed."""
    model = fresh().model if fresh else copy.deepcopy(loaded.model)
    seconds = run_oracle(model, method, token_ids, sparsity, sparsity_type, **oracle_switches)
    weights = layer_weights(model)
    del model
    return OracleRun(weights, seconds)


def compare(loaded, method: str, token_ids: torch.Tensor, sparsity: float = 0.5,
            sparsity_type: str = "unstructured", switches: dict[str, Any] | None = None,
            oracle: OracleRun | None = None, fresh: Callable[[], Any] | None = None) -> Comparison:
    """prunelab's `method` (defaults + `switches`) against the oracle, each on its own deep copy
    of loaded.model with the same calibration `token_ids` ([N, T]); loaded.model is not changed.

    `oracle`: a previous `oracle_run` of the same method and sparsity to compare against (the
    oracle does not depend on prunelab's switches). `fresh`: a function returning a new LoadedModel
    of the same weights (`plain_loaded`), used for each side instead of a deep copy."""
    switches = dict(switches or {})
    if oracle is None:
        oracle = oracle_run(loaded, method, token_ids, sparsity, sparsity_type, fresh=fresh)
    ours = fresh() if fresh else with_model(loaded, copy.deepcopy(loaded.model))
    method_object = prunelab_method(method, sparsity, sparsity_type, **switches)
    seconds = run_prunelab(ours, method_object, token_ids)
    result = compare_weights(layer_weights(ours.model), oracle.weights, method=method,
                             sparsity=sparsity, sparsity_type=sparsity_type,
                             setting=setting_label(switches), seconds_prunelab=seconds,
                             seconds_oracle=oracle.seconds)
    del ours
    return result
