"""Layer-sequential calibration: the loop every data-aware pruning method shares.

As in SparseGPT and Wanda: capture the inputs of decoder layer 0 for all calibration samples,
together with every keyword argument the layer receives (attention mask, position ids, rotary
position embeddings, cache flags); then visit the layers one by one. At each layer the caller may run
the samples through it with hooks (statistics), change it (prune), and the runner then computes the
layer's outputs, which become the next layer's inputs. Only the visited layer needs to be on the
compute device; activations live in two buffers (inputs and outputs of the current layer), never the
whole model's. On a streamed model (`models.streaming`) only the visited layer is in memory at all:
it is read from the checkpoint when visited and written back, if changed, when left.

`propagate="pruned"` feeds the outputs of the modified layer forward (the references' default);
`propagate="dense"` feeds the outputs the layer had before the caller changed it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn
from tqdm.auto import tqdm

from prunelab.models.adapter import BY_LAYER_TYPE, ModelAdapter, input_device

log = logging.getLogger(__name__)

Propagate = Literal["pruned", "dense"]


class _InputsCaptured(Exception):
    """Raised by the layer-0 hook to stop the forward pass once the inputs are stored."""


@dataclass
class LayerInputs:
    """Hidden states entering a layer, per batch, and the keyword arguments every layer receives."""

    hidden: list[torch.Tensor]  # per batch: [B, T, C]
    kwargs: list[dict[str, Any]]  # per batch: attention_mask, position_ids, position_embeddings, ...

    @property
    def num_samples(self) -> int:
        return sum(h.shape[0] for h in self.hidden)


def move_to(value: Any, device: torch.device) -> Any:
    """Recursively move tensors inside tuples, lists and dicts."""
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, tuple):
        return tuple(move_to(v, device) for v in value)
    if isinstance(value, list):
        return [move_to(v, device) for v in value]
    if isinstance(value, dict):
        return {k: move_to(v, device) for k, v in value.items()}
    return value


def batched(samples: torch.Tensor, batch_size: int) -> list[torch.Tensor]:
    """[N, T] token ids -> list of [B, T] batches."""
    return [samples[i : i + batch_size] for i in range(0, samples.shape[0], batch_size)]


@torch.no_grad()
def capture_layer_inputs(
    adapter: ModelAdapter, samples: torch.Tensor, batch_size: int = 1, storage: torch.device | None = None
) -> LayerInputs:
    """Run the model up to decoder layer 0 and keep what it receives.

    Args:
        samples: [N, T] token ids of the calibration set.
        storage: where captured hidden states are kept (default: where layer 0 computes).
    """
    layer0 = adapter.layers[0]
    hidden: list[torch.Tensor] = []
    kwargs: list[dict[str, Any]] = []

    keep = adapter.store.keep_activation if adapter.streamed else (lambda t: t)  # streamed: may spill

    def hook(_module: nn.Module, args: tuple, layer_kwargs: dict):
        h = args[0] if args else layer_kwargs.pop("hidden_states")
        hidden.append(keep(h.detach() if storage is None else h.detach().to(storage)))
        kwargs.append({k: v for k, v in layer_kwargs.items() if k != "hidden_states"})
        raise _InputsCaptured

    ids_device = input_device(adapter.model)
    types = adapter.layer_types
    if types is not None:  # layers of several attention types: each type's kwargs
        return _capture_by_layer_type(adapter, samples, batch_size, types, keep, storage, ids_device)
    handle = layer0.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        with adapter.outside_in_memory("embeddings"):  # streamed: read for the capture only
            for batch in batched(samples, batch_size):
                try:
                    adapter.model(input_ids=batch.to(ids_device), use_cache=False)
                except _InputsCaptured:
                    pass
    finally:
        handle.remove()
    return LayerInputs(hidden, kwargs)


def _capture_by_layer_type(adapter: ModelAdapter, samples: torch.Tensor, batch_size: int, types: list[str],
                           keep: Callable, storage: torch.device | None, ids_device: torch.device) -> LayerInputs:
    """`capture_layer_inputs` for a model whose layers differ in attention type (Gemma 3): the model
    hands each layer the mask and rotary embeddings of its type, so the layers up to the first of
    every type pass their input through (`ModelAdapter.passing_through`) while their keyword
    arguments are kept; layer 0's input is the hidden state, and the kwargs carry every type's under
    `BY_LAYER_TYPE`, from which `ModelAdapter.call_layer` gives each layer its own."""
    first = {kind: types.index(kind) for kind in dict.fromkeys(types)}  # type -> its first layer
    hidden: list[torch.Tensor] = []
    kwargs: list[dict[str, Any]] = []
    with adapter.outside_in_memory("embeddings"):
        for batch in batched(samples, batch_size):
            calls: list = []
            with adapter.passing_through(max(first.values()) + 1, calls, _InputsCaptured):
                try:
                    adapter.model(input_ids=batch.to(ids_device), use_cache=False)
                except _InputsCaptured:
                    pass
            h = calls[0][1]
            hidden.append(keep(h.detach() if storage is None else h.detach().to(storage)))
            by_type = {kind: calls[index][2] for kind, index in first.items()}
            kwargs.append({**calls[0][2], BY_LAYER_TYPE: by_type})
    return LayerInputs(hidden, kwargs)


class LayerStep:
    """One visit of one decoder layer: run samples through it, observe, change it."""

    def __init__(self, index: int, layer: nn.Module, inputs: LayerInputs, device: torch.device, keep: bool,
                 store_output: Callable[[torch.Tensor], torch.Tensor] = lambda t: t):
        self.store_output = store_output  # a streamed model's activations may spill to disk
        self.index = index
        self.layer = layer
        self.inputs = inputs
        self.device = device
        self._keep = keep
        self.dense_outputs: list[torch.Tensor] | None = None

    @torch.no_grad()
    def forward(self, keep_outputs: bool | None = None) -> list[torch.Tensor] | None:
        """Run every calibration batch through the layer as it is now (hooks fire).

        The first call's outputs are kept when the runner propagates dense outputs, or when
        `keep_outputs=True` (a scorer comparing a layer's input with its output).
        """
        keep = self._keep if keep_outputs is None else keep_outputs
        outputs: list[torch.Tensor] = []
        for h, kw in zip(self.inputs.hidden, self.inputs.kwargs):
            out = ModelAdapter.call_layer(self.layer, h.to(self.device), move_to(kw, self.device))
            if keep:
                outputs.append(self.store_output(out.to(h.device)))
        if keep and self.dense_outputs is None:
            self.dense_outputs = outputs
        return outputs if keep else None


_LAYER_LISTENERS: ContextVar[tuple[Callable[[str, int, int], None], ...]] = ContextVar(
    "layer_listeners", default=())


@contextmanager
def on_layer_done(listener: Callable[[str, int, int], None]) -> Iterator[None]:
    """Call listener(desc, layer index, number of layers) each time a layer-sequential pass has
    finished a layer (pruned it and propagated its outputs): how a tracker streams per-layer
    progress without any method knowing about it."""
    token = _LAYER_LISTENERS.set(_LAYER_LISTENERS.get() + (listener,))
    try:
        yield
    finally:
        _LAYER_LISTENERS.reset(token)


class LayerSequentialRunner:
    """Visit decoder layers in order, propagating calibration activations between them.

    Usage::

        inputs = capture_layer_inputs(adapter, samples)
        for step in LayerSequentialRunner(adapter, inputs):
            with collect_linear_inputs(adapter.linears(step.layer), SquaredColumnNorm) as stats:
                step.forward()
            prune(step.layer, stats)  # the runner then computes the pruned layer's outputs
    """

    def __init__(
        self,
        adapter: ModelAdapter,
        inputs: LayerInputs,
        device: torch.device | None = None,
        propagate: Propagate = "pruned",
        layers: Sequence[int] | None = None,
        progress: bool = True,
        desc: str = "layers",
    ):
        if propagate not in ("pruned", "dense"):
            raise ValueError(f"propagate must be 'pruned' or 'dense', not {propagate!r}")
        self.adapter = adapter
        self.inputs = inputs
        self.device = device
        self.propagate = propagate
        self.layer_indices = list(range(adapter.num_layers)) if layers is None else list(layers)
        self.progress = progress
        self.desc = desc

    def __iter__(self) -> Iterator[LayerStep]:
        last = self.layer_indices[-1] if self.layer_indices else -1
        streamed = self.adapter.streamed
        for index in tqdm(range(last + 1), desc=self.desc, disable=not self.progress, leave=False):
            with self.adapter.layer_in_memory(index, self.device) as layer:  # streamed: read now
                home = next(layer.parameters()).device
                device = self.device or home
                if not streamed:
                    layer.to(device)
                step = LayerStep(index, layer, self.inputs, device, keep=self.propagate == "dense",
                                 store_output=self.adapter.store.keep_activation if streamed else (lambda t: t))
                if index in self.layer_indices:
                    yield step
                if self.propagate == "dense" and step.dense_outputs is not None:
                    outputs = step.dense_outputs
                else:
                    outputs = step.forward(keep_outputs=True)
                self.inputs = LayerInputs(outputs, self.inputs.kwargs)
                step.inputs = self.inputs
                if not streamed:
                    layer.to(home)
                for listener in _LAYER_LISTENERS.get():
                    listener(self.desc, index, last + 1)
            # streamed: the layer is back on disk here (in its own shard if the step changed it)

    @property
    def outputs(self) -> LayerInputs:
        """Hidden states after the last visited layer (inputs of the next one)."""
        return self.inputs
