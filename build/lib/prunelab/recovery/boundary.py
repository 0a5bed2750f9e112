"""Depth-pruning recovery helpers: the removed blocks, where their operators act, and the dense
model's states around each block.

After removing block [s, e), the dense model's h_e must be rebuilt from h_s. LinearPatch and Ghosted
do it with an operator x <- x W at the input of the first surviving layer (a forward pre-hook on it;
`prunelab.models.boundary_operators` attaches, saves and reloads them). That one site covers both
edge cases the references get wrong: a block starting at layer 0 (the operator acts on the
embeddings' output) and a block ending at the last layer (the site is the final norm's input, i.e.
before the final norm). ReplaceMe merges its operator into a weight instead and needs no site.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from prunelab.calibration.hidden_states import boundary_activations
from prunelab.errors import ConfigError
from prunelab.models.boundary_operators import FINAL_NORM
from prunelab.recovery.base import RecoveryContext


def contiguous_blocks(removed: Sequence[int]) -> list[tuple[int, int]]:
    """Sorted removed layer indices -> maximal runs [s, e). [1, 2, 5] -> [(1, 3), (5, 6)]."""
    blocks: list[tuple[int, int]] = []
    for i in sorted(removed):
        if blocks and blocks[-1][1] == i:
            blocks[-1] = (blocks[-1][0], i + 1)
        else:
            blocks.append((i, i + 1))
    return blocks


def site_of(dense_end: int, removed: Sequence[int], num_dense: int) -> int | str:
    """Where the operator of a boundary ending at dense layer e acts in the pruned model: the input
    of the first surviving layer at or after e (its new index), or the final norm's input when none
    survives. Per-layer operators of adjacent removed layers (l, l + 1), (l + 1, l + 2) thus share
    one site and run in the order they were attached: x <- x W_l W_{l+1}."""
    removed = set(removed)
    survivor = dense_end
    while survivor in removed:
        survivor += 1
    if survivor >= num_dense:
        return FINAL_NORM
    return survivor - sum(1 for i in removed if i < survivor)


def depth_report(ctx: RecoveryContext, recovery: str) -> tuple[list[int], list[nn.Module]]:
    """The removed layers and the dense layer list; a clear error after a non-depth method."""
    if ctx.report.dense_layers is None:
        raise ConfigError(f"recovery={recovery} repairs depth pruning: use pruning=depth")
    return sorted(ctx.report.removed_layers), list(ctx.report.dense_layers)


def calibration_subset(ctx: RecoveryContext, nsamples: int | None) -> torch.Tensor:
    samples = ctx.prune.calibration()  # [N, T]
    return samples if nsamples is None else samples[:nsamples]


def collect(ctx: RecoveryContext, boundaries: Sequence[tuple[int, int]], samples: torch.Tensor,
            consume: Callable[[int, list], None], mlp_outputs: bool = False) -> None:
    """Stream the UNPRUNED model's boundary states (report.dense_layers) to consume(k, batches)."""
    adapter = ctx.prune.loaded.adapter
    with adapter.layers_replaced(ctx.report.dense_layers):
        for k, batches in boundary_activations(adapter, samples, boundaries, ctx.prune.batch_size,
                                               mlp_outputs=mlp_outputs, progress=ctx.prune.progress):
            consume(k, batches)
