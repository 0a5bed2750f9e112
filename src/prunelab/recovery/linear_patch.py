"""LinearPatch: rescale the residual stream at the pruning boundary, channel by channel.

Chen et al., "A Simple Linear Patch Revives Layer-Pruned Large Language Models" (LinearPatch), 2025.
For each removed block [s, e), on the UNPRUNED model's calibration states X_pre = h_s, X_post = h_e:
  1. Rotate (LinearPatch-R: Z = X Q with Q an orthonormal Hadamard matrix) or not (LinearPatch-D: Q = I).
  2. c_j = mean |Z_post[:, j]| / mean |Z_pre[:, j]| over all calibration tokens.
  3. W = Q diag(c) Q^T, applied as x <- x W (fp32, cast back) at the input of the first surviving layer.
Select with `recovery=linear_patch_d` or `recovery=linear_patch_r`. The scale is measured in the
rotated basis, as the reference does. Hidden sizes that are not powers of two use Sylvester x Paley
Hadamard matrices, else an orthonormal DCT basis (`recovery.hadamard`; the record says which).
Quirk: the reference averages per-batch ratios and divides the sum by a hard-coded 128 batches
(wrong with any other count); `reference_scale: true` reproduces it. The reference hooks the output
of layer s - 1 (nothing when s = 0) and casts the patch output to fp16; here the site is the input
of layer e (or the final norm), which covers s = 0 and blocks ending at the last layer.
"""

from __future__ import annotations

from typing import Any

import torch

from prunelab.errors import ConfigError
from prunelab.models.boundary_operators import BoundaryOperator, attach
from prunelab.recovery.base import RecoveryContext
from prunelab.recovery.boundary import (
    calibration_subset, collect, contiguous_blocks, depth_report, site_of,
)
from prunelab.recovery.hadamard import rotation

REFERENCE_BATCHES = 128  # the reference's hard-coded divisor


class AbsMeans:
    """Per-channel mean |Z| of the rotated pre- and post-boundary states, and per-batch ratios."""

    def __init__(self, q: torch.Tensor | None):
        self.q = q  # [C, C] orthonormal, or None (diagonal variant)
        self.pre = self.post = self.ratio_sum = None
        self.rows = 0

    def update(self, x_pre: torch.Tensor, x_post: torch.Tensor) -> None:
        z_pre, z_post = (x.reshape(-1, x.shape[-1]).double() for x in (x_pre, x_post))  # [N, C]
        if self.q is not None:
            q = self.q.to(z_pre.device)
            z_pre, z_post = z_pre @ q, z_post @ q  # [N, C]
        pre, post = z_pre.abs().sum(0), z_post.abs().sum(0)  # [C]
        ratio = linear_patch_scale(pre, post)  # [C] this batch's own ratio (reference quirk)
        self.pre = pre if self.pre is None else self.pre + pre
        self.post = post if self.post is None else self.post + post
        self.ratio_sum = ratio if self.ratio_sum is None else self.ratio_sum + ratio
        self.rows += z_pre.shape[0]


def linear_patch_scale(abs_pre: torch.Tensor, abs_post: torch.Tensor) -> torch.Tensor:
    """c = mean|X_post| / mean|X_pre| per channel ([C] sums or means over the same tokens); a
    channel that is zero before the boundary keeps scale 1."""
    return torch.where(abs_pre > 0, abs_post / abs_pre.clamp_min(1e-300), torch.ones_like(abs_pre))  # [C]


def linear_patch_matrix(scale: torch.Tensor, q: torch.Tensor | None) -> torch.Tensor:
    """W = Q diag(c) Q^T [C, C], or c itself [C] for the diagonal variant (q None)."""
    if q is None:
        return scale  # [C]
    q = q.to(scale.device, torch.float64)
    return (q * scale[None, :]) @ q.T  # [C, C]


class LinearPatch:
    requires_depth = True  # repairs removed layers: needs a depth-pruning report
    streamable = True  # boundary states through the layer runner; operators are small and resident
    def __init__(self, rotate: bool = False, nsamples: int | None = None, reference_scale: bool = False):
        if nsamples is not None and nsamples < 1:
            raise ConfigError("recovery.nsamples must be a positive number of sequences or null")
        self.rotate, self.nsamples, self.reference_scale = bool(rotate), nsamples, bool(reference_scale)
        self.name = "linear_patch_r" if self.rotate else "linear_patch_d"

    def fit(self, ctx: RecoveryContext) -> tuple[list[tuple[int, int]], list[torch.Tensor], str]:
        removed, _ = depth_report(ctx, self.name)
        blocks = contiguous_blocks(removed)
        hidden = ctx.prune.loaded.adapter.hidden_size
        q, basis = rotation(hidden) if self.rotate else (None, "identity")
        stats = [AbsMeans(q) for _ in blocks]

        def consume(k: int, batches: list) -> None:
            for b in batches:
                stats[k].update(b.x_pre, b.x_post)  # [B, T, C] each

        if blocks:
            collect(ctx, blocks, calibration_subset(ctx, self.nsamples), consume)
        weights = []
        for s in stats:
            if self.reference_scale:
                scale = s.ratio_sum / REFERENCE_BATCHES  # [C]
            else:
                scale = linear_patch_scale(s.pre, s.post)  # [C]
            weights.append(linear_patch_matrix(scale, q))
        return blocks, weights, basis

    def recover(self, ctx: RecoveryContext) -> dict[str, Any]:
        blocks, weights, basis = self.fit(ctx)
        removed, dense_layers = depth_report(ctx, self.name)
        loaded = ctx.prune.loaded
        kind = "matrix" if self.rotate else "diagonal"
        sites = []
        for (s, e), w in zip(blocks, weights):
            site = site_of(e, removed, len(dense_layers))
            attach(loaded.model, site, BoundaryOperator(w, kind, self.name), loaded.adapter)
            sites.append({"block": [s, e], "site": site})
        return {"method": self.name, "operators": sites, "basis": basis,
                "reference_scale": self.reference_scale,
                "added_parameters": sum(w.numel() for w in weights)}
