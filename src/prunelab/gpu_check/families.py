"""Every method family once: the `prunelab.prune` keywords of each, shared by the GPU node check
(`prunelab-gpu-check`, check a) and tests/test_methods_on_device.py, so that a family added here is
run by both and neither list goes stale.

One entry per family, not per option: an allocation policy is run over Wanda, a depth scorer with
one removed layer (a recovery where the family has one), N:M once per masking method that has it,
each width method at its defaults (the reference's ratio 0.2; SliceGPT 25% of the hidden dimension).
"""

from __future__ import annotations

from typing import Any

METHOD_FAMILIES: dict[str, dict[str, Any]] = {  # family -> prunelab.prune keywords
    # unstructured and N:M
    "magnitude 2:4": dict(method="magnitude", sparsity=0.5, sparsity_type="2:4"),
    "wanda": dict(method="wanda", sparsity=0.5),
    "wanda 2:4": dict(method="wanda", sparsity=0.5, sparsity_type="2:4"),
    "sparsegpt": dict(method="sparsegpt", sparsity=0.5),
    "sparsegpt 2:4": dict(method="sparsegpt", sparsity=0.5, sparsity_type="2:4"),
    "ria": dict(method="ria", sparsity=0.5),
    "wanda + dsnot": dict(method="wanda", sparsity=0.5, refine="dsnot"),
    "alps": dict(method="alps", sparsity=0.7),
    # layer-wise allocation
    "wanda + owl": dict(method="wanda", sparsity=0.5, allocation="owl"),
    "wanda + pals": dict(method="wanda", sparsity=0.5, allocation="pals"),
    "wanda + alpha": dict(method="wanda", sparsity=0.5, allocation="alpha"),
    "wanda + gradient": dict(method="wanda", sparsity=0.5, allocation="gradient"),
    "wanda + dlp": dict(method="wanda", sparsity=0.5, allocation="dlp"),
    # depth scorers and recoveries
    "depth: block influence + ghosted": dict(method="depth", scorer="block_influence", num_layers=1,
                                             recovery="ghosted"),
    "depth: sleb": dict(method="depth", scorer="sleb", num_layers=1),
    "depth: angular + replaceme": dict(method="depth", scorer="angular", num_layers=1, recovery="replaceme",
                                        protect_first=1),
    "depth: wrp + linear_patch_r": dict(method="depth", scorer="wrp", num_layers=1, recovery="linear_patch_r"),
    # width (heads and channels cut out of the modules; SliceGPT slices the hidden dimension)
    "width: flap": dict(method="flap"),
    "width: wanda_sp": dict(method="wanda_sp"),
    "width: magnitude_sp": dict(method="magnitude_sp"),
    "width: llm_pruner": dict(method="llm_pruner", layer_start=0, layer_end=None),  # any depth
    "width: slicegpt": dict(method="slicegpt", sparsity=0.25),
}
