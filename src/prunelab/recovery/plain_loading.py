"""A depth-pruned model with boundary operators must not load silently wrong with plain
`from_pretrained` (which knows nothing of the operators' forward pre-hooks).

`save_for_plain_loading(model, directory, save)` before saving:

1. folds into the weights every operator where that is exact: operators at the first layer's input
   (a removed block starting at layer 0) act on the token embeddings' output, so E <- op(E) gives
   the same hidden states, provided the embedding is the first layer's only input (one embedding
   module, no positional embedding added) and is not tied to the output head;
2. saves with `save` (recovery.boundary.save_recovered: checkpoint plus operator files);
3. when operators remain, adds a marker weight `prunelab_boundary_ops.<warning>` to the checkpoint
   (one more shard, listed in model.safetensors.index.json): plain `from_pretrained` then reports
   it as UNEXPECTED in its load report, whose key name says the operators were not applied and to
   load with `prunelab.models.load_model`, which re-attaches them (and tolerates the marker).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from prunelab.models.adapter import ModelAdapter
from prunelab.models.boundary_operators import ATTR, BoundaryOperators

log = logging.getLogger(__name__)

MARKER_KEY = f"{ATTR}.NOT_APPLIED_by_plain_from_pretrained__load_with_prunelab.models.load_model"
MARKER_FILE = "prunelab-boundary-marker.safetensors"
SINGLE_FILE, INDEX = "model.safetensors", "model.safetensors.index.json"


def embedding_fold_is_exact(model: nn.Module, adapter: ModelAdapter) -> bool:
    """The first layer's input is exactly the (untied) token embedding's output."""
    embedding, head = model.get_input_embeddings(), model.get_output_embeddings()
    tied = head is not None and head.weight.data_ptr() == embedding.weight.data_ptr()
    return len(adapter.arch.embeddings) == 1 and not tied


@torch.no_grad()
def fold_exact_operators(model: nn.Module) -> int:
    """Fold operators at the first layer's input into the token embeddings; returns how many."""
    container = getattr(model, ATTR, None)
    if container is None or not len(container.ops):
        return 0
    adapter = ModelAdapter(model)
    first = adapter.layers[0] if adapter.num_layers else None
    foldable = [op for op, target in zip(container.ops, container.targets) if target is first]
    if not foldable or not embedding_fold_is_exact(model, adapter):
        return 0
    with adapter.outside_in_memory("embeddings"):  # streamed: read, folded, written back
        weight = model.get_input_embeddings().weight  # [V, C]
        for op in foldable:  # in attachment order, as the hook applies them
            weight.copy_(op(weight))
        del weight
    remaining = BoundaryOperators()
    for op, target in zip(container.ops, container.targets):
        if target is not first:
            remaining.add(target, op)
    container.remove()
    del model._modules[ATTR]
    if len(remaining.ops):
        setattr(model, ATTR, remaining)
    log.info("folded %d boundary operator(s) into the token embeddings (exact)", len(foldable))
    return len(foldable)


def mark_unapplied_operators(directory: Path, count: int) -> None:
    """Add the marker weight as an extra shard so plain from_pretrained reports it."""
    directory = Path(directory)
    save_file({MARKER_KEY: torch.tensor([count])}, str(directory / MARKER_FILE), metadata={"format": "pt"})
    if (directory / INDEX).exists():
        index = json.loads((directory / INDEX).read_text())
    else:  # a single file: list its keys in an index (from_pretrained then reads the index)
        shard = "model-00001-of-00001.safetensors"
        (directory / SINGLE_FILE).rename(directory / shard)
        with safe_open(str(directory / shard), framework="pt") as handle:
            index = {"metadata": {}, "weight_map": {key: shard for key in handle.keys()}}
    index["weight_map"][MARKER_KEY] = MARKER_FILE
    (directory / INDEX).write_text(json.dumps(index, indent=1))


def save_for_plain_loading(model: nn.Module, directory: str | Path,
                           save: Callable[[nn.Module, Path], None]) -> None:
    """Fold what is exact, save, and mark the checkpoint when operators remain (module docstring)."""
    fold_exact_operators(model)
    save(model, Path(directory))
    container = getattr(model, ATTR, None)
    if container is not None and len(container.ops):
        mark_unapplied_operators(Path(directory), len(container.ops))
