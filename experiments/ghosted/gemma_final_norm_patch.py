"""Why LinearPatch hurts Gemma-3-270M: its patch before the final norm, measured alone.

Removes only Gemma's last layer (17) and compares the next-token loss without recovery and with
LinearPatch-D's per-channel scale c = mean|h_out| / mean|h_in| of layer 17 (fitted on the same
tokens) applied at the input of the final norm, where prunelab (and the reference, on the output of
layer s - 1) puts it for a block that ends at the last layer. Text: Python's pydoc topics (8 x 128
tokens, no <bos>, as the calibration windows). Prints the scale's range and the three losses.

    python experiments/ghosted/gemma_final_norm_patch.py
"""

from __future__ import annotations

import torch
from pydoc_data.topics import topics

import prunelab
from prunelab.models.adapter import ModelAdapter


def main() -> None:
    torch.set_num_threads(1)
    model, tokenizer = prunelab.load("gemma3_270m")
    adapter = ModelAdapter(model)  # the layer list and final norm, wherever the architecture keeps them
    text = " ".join(list(topics.values())[:40])
    ids = tokenizer(text, return_tensors="pt").input_ids[:, 1:1 + 8 * 128].reshape(8, 128)  # [8, 128]
    seen: dict[str, torch.Tensor] = {}

    def grab(key):
        def hook(_module, args, kwargs):
            seen[key] = (kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]).detach()
        return hook

    hooks = [adapter.layers[-1].register_forward_pre_hook(grab("in"), with_kwargs=True),
             adapter.final_norm.register_forward_pre_hook(grab("out"), with_kwargs=True)]
    with torch.no_grad():
        dense = model(input_ids=ids, labels=ids).loss
    for hook in hooks:
        hook.remove()
    width = seen["in"].shape[-1]
    h_in, h_out = (seen[k].reshape(-1, width).double() for k in ("in", "out"))  # [N, C]
    scale = (h_out.abs().mean(0) / h_in.abs().mean(0)).float()  # [C]
    print(f"LinearPatch-D scale of the last layer: min {scale.min():.3f}, median {scale.median():.3f}, "
          f"max {scale.max():.3f}")
    adapter.remove_layers([adapter.num_layers - 1])
    with torch.no_grad():
        removed = model(input_ids=ids, labels=ids).loss
        handle = adapter.final_norm.register_forward_pre_hook(lambda _m, args: (args[0] * scale.to(args[0].dtype),))
        patched = model(input_ids=ids, labels=ids).loss
        handle.remove()
    print(f"loss (nats per token): dense {dense:.3f}; last layer removed {removed:.3f}; "
          f"+ LinearPatch-D before the final norm {patched:.3f}")


if __name__ == "__main__":
    main()
