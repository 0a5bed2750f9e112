"""The two signals SliceGPT takes from one decoder layer: the input of its MLP norm (the residual
stream between attention and MLP) and the layer's output.

Ashkboos et al., ICLR 2024 (microsoft/TransformerCompression `model_utils.get_signals`): the
layer is run on every calibration batch with a forward hook on the second norm.
"""

from __future__ import annotations

import torch
from torch import nn

from prunelab.calibration.runner import LayerInputs, move_to
from prunelab.models.adapter import ModelAdapter


@torch.no_grad()
def layer_signals(adapter: ModelAdapter, layer: nn.Module, inputs: LayerInputs
                  ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(inputs of the MLP norm, outputs of the layer), per batch [B, T, C], on the inputs' device."""
    _, mlp_norm = adapter.norms(layer)
    device = next(layer.parameters()).device
    mids: list[torch.Tensor] = []

    def hook(_module: nn.Module, args: tuple) -> None:
        mids.append(args[0].detach())

    outputs: list[torch.Tensor] = []
    handle = mlp_norm.register_forward_pre_hook(hook)
    try:
        for h, kw in zip(inputs.hidden, inputs.kwargs):
            out = ModelAdapter.call_layer(layer, h.to(device), move_to(kw, device))
            outputs.append(out.to(h.device))
            mids[-1] = mids[-1].to(h.device)
    finally:
        handle.remove()
    return mids, outputs
