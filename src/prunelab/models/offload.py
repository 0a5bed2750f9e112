"""A streamed model's whole forward pass on an existing engine: accelerate's offload.

lm-eval's zero-shot evaluation calls the model's forward pass, not a layer-sequential one; for a
streamed model (`models.streaming`) it runs on the current model as a checkpoint loaded with
`device_map="auto"` and `max_memory` (weights beyond the budget stay on disk, each layer moved in
by accelerate's hooks when it runs), not on a second home-made forward. The checkpoint is the
source when nothing changed, else the current model saved once, shard by shard, with any boundary
operators beside it (re-attached on loading).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager

from torch import nn

from prunelab.models.boundary_operators import apply_saved_boundary_operators, has_operators, save_recovered
from prunelab.models.streaming import LayerStore, release_freed_memory, store_of


@contextmanager
def forward_model(model: nn.Module) -> Iterator[nn.Module]:
    """A model whose whole forward pass can run: the model itself when in memory; a streamed
    model through accelerate's offload."""
    store = store_of(model)
    if store is None:
        yield model
        return
    with offloaded(store) as runnable:
        yield runnable


@contextmanager
def offloaded(store: LayerStore, memory_bytes: int | None = None) -> Iterator[nn.Module]:
    """The store's current model loaded through accelerate's offload, removed on exit."""
    from transformers import AutoModelForCausalLM

    folder = store.source
    if store.changed() or has_operators(store.model):
        folder = store.work_dir / "checkpoint"
        save_recovered(store.model, folder, save_weights=store.save_checkpoint)
    limit = memory_bytes or store.offload_memory_bytes()
    key = (store.device.index or 0) if store.device.type == "cuda" else "cpu"
    max_memory = {key: limit, **({"cpu": limit} if key != "cpu" else {})}
    offload = store.work_dir / "offload"
    dtype = next(iter(store.model.parameters())).dtype
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, device_map="auto",
                                                 max_memory=max_memory, offload_folder=str(offload))
    model.eval()
    apply_saved_boundary_operators(model, folder)
    try:
        yield model
    finally:
        del model
        shutil.rmtree(offload, ignore_errors=True)
        release_freed_memory()
