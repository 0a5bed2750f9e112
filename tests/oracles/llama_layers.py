"""The layer-sequential scaffolding the Wanda and SparseGPT references share, for Llama models.

Both references (Sun et al. 2023, `prune_wanda` / `prune_sparsegpt`; Frantar & Alistarh 2023,
`llama_sequential`) replace decoder layer 0 with a "catcher" that stores what it receives and stops
the forward pass, then walk the layers one by one: run every calibration sample (one per forward)
through the layer with hooks on its linears, prune the layer, run the samples again through the
pruned layer and hand those outputs to the next layer. This module is that scaffolding, written
for the oracles: it imports nothing from prunelab.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class _StopForward(Exception):
    """Raised by the catcher once it has stored layer 0's inputs."""


class _Catcher(nn.Module):
    """Stands in for decoder layer 0: keeps its hidden states and keyword arguments."""

    def __init__(self, layer: nn.Module):
        super().__init__()
        self.layer = layer  # kept so attributes such as `attention_type` stay reachable
        self.hidden: list[torch.Tensor] = []
        self.kwargs: list[dict[str, Any]] = []

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(super().__getattr__("layer"), name)

    def forward(self, hidden_states: torch.Tensor, *args: Any, **kwargs: Any):
        if args:
            raise TypeError("the oracle catcher expects layer 0's arguments after the hidden "
                            "states by keyword")
        self.hidden.append(hidden_states.detach().clone())
        self.kwargs.append(dict(kwargs))
        raise _StopForward


@torch.no_grad()
def capture_layer0_inputs(model: nn.Module, token_ids: torch.Tensor, batch_size: int = 1
                          ) -> tuple[list[torch.Tensor], list[dict[str, Any]]]:
    """What decoder layer 0 receives for each calibration sample, one sample per forward pass
    (or `batch_size` consecutive samples per forward, as SliceGPT's reference batches them).

    Args:
        model: a Hugging Face `LlamaForCausalLM` (anything with `model.model.layers`).
        token_ids: [nsamples, seqlen] calibration token ids.

    Returns:
        (hidden states, one [batch, seqlen, hidden] per forward (batch 1 by default); the keyword
        arguments layer 0 got for it: attention mask, position ids, rotary position embeddings,
        cache flags).
    """
    layers = model.model.layers
    original = layers[0]
    catcher = _Catcher(original)
    layers[0] = catcher
    try:
        for j in range(0, token_ids.shape[0], batch_size):
            try:
                model(input_ids=token_ids[j : j + batch_size], use_cache=False)
            except _StopForward:
                pass
    finally:
        layers[0] = original
    return catcher.hidden, catcher.kwargs


def run_layer(layer: nn.Module, hidden: torch.Tensor, kwargs: dict[str, Any]) -> torch.Tensor:
    """One decoder layer on one sample's hidden states ([1, seqlen, hidden])."""
    out = layer(hidden, **kwargs)
    return out[0] if isinstance(out, tuple) else out


def decoder_linears(layer: nn.Module) -> dict[str, nn.Linear]:
    """Every nn.Linear inside one decoder layer, by name, in module order (q, k, v, o, gate, up,
    down for Llama): what the references' `find_layers` returns."""
    return {name: module for name, module in layer.named_modules() if isinstance(module, nn.Linear)}


class InputHooks:
    """Forward hooks that hand each linear's input to `observe(name, x)`; x as the linear got it
    ([1, seqlen, in]). Use as a context manager: the hooks are removed on exit."""

    def __init__(self, linears: dict[str, nn.Linear], observe):
        self.linears, self.observe, self.handles = linears, observe, []

    def __enter__(self) -> InputHooks:
        for name, linear in self.linears.items():
            def hook(_module, inputs, _output, name=name):
                self.observe(name, inputs[0].detach())
            self.handles.append(linear.register_forward_hook(hook))
        return self

    def __exit__(self, *exc) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []


@torch.no_grad()
def layer_by_layer(model: nn.Module, token_ids: torch.Tensor, make_observer, prune_layer) -> None:
    """The references' sequential loop: statistics from the (already pruned) inputs, prune, then
    propagate the pruned layer's outputs.

    Args:
        make_observer: called per layer with its linears; returns (observe(name, x), state).
        prune_layer: called per layer as prune_layer(linears, state) after the statistics pass.
    """
    inputs, kwargs = capture_layer0_inputs(model, token_ids)
    for layer in model.model.layers:
        linears = decoder_linears(layer)
        observe, state = make_observer(linears)
        with InputHooks(linears, observe):
            for hidden, kw in zip(inputs, kwargs):
                run_layer(layer, hidden, kw)
        prune_layer(linears, state)
        inputs = [run_layer(layer, hidden, kw) for hidden, kw in zip(inputs, kwargs)]
