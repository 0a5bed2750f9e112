"""Ghosted Layers: replace a removed block by the least-squares linear map of the residual stream.

Seed method. For each removed block [s, e), on the UNPRUNED model's calibration states:
  1. X_pre = h_s, X_post = h_e over all calibration tokens ([N, C] each).
  2. W* = argmin ||X_pre W - X_post||_F^2 = I + M, (X_pre^T X_pre + eps I) M = X_pre^T (X_post - X_pre),
     in float64 from streamed Gram matrices, eps = 1e-6 absolute, no bias.
  3. Apply x <- x W* (fp32, cast back) to the whole residual stream at the boundary.
Select with `recovery=ghosted`. `operators: auto` fits one operator per block when the removal is one
contiguous block and one per removed layer otherwise (each fitted on the unpruned model, applied in
order, as the reference does); `per_block` / `per_layer` force either. Unlike the reference, a block
starting at layer 0 gets its operator on the embeddings' output and a block ending at the last layer
gets it before the final norm. The C x C operators are not mergeable into a down projection; they
are stored beside the checkpoint (`models.boundary_operators.save_recovered`).
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from prunelab.errors import ConfigError
from prunelab.models.boundary_operators import BoundaryOperator, attach
from prunelab.recovery.base import RecoveryContext
from prunelab.recovery.boundary import (
    calibration_subset, collect, contiguous_blocks, depth_report, site_of,
)

log = logging.getLogger(__name__)

OPERATOR_MODES = ("auto", "per_block", "per_layer")


class NormalEquations:
    """Streams X^T X and X^T D in float64 for a least-squares fit X T ~ D (X, D: [N, C] rows)."""

    def __init__(self) -> None:
        self.xtx: torch.Tensor | None = None  # [C, C]
        self.xtd: torch.Tensor | None = None  # [C, C]
        self.rows = 0

    def update(self, x: torch.Tensor, d: torch.Tensor) -> None:
        x = x.reshape(-1, x.shape[-1]).double()  # [N, C]
        d = d.reshape(-1, d.shape[-1]).double()  # [N, C]
        xtx, xtd = x.T @ x, x.T @ d  # [C, C], [C, C]
        self.xtx = xtx if self.xtx is None else self.xtx + xtx
        self.xtd = xtd if self.xtd is None else self.xtd + xtd
        self.rows += x.shape[0]


def ridge_solve(xtx: torch.Tensor, xtd: torch.Tensor, ridge: float) -> torch.Tensor:
    """T = (X^T X + ridge I)^-1 X^T D in float64; a singular system falls back to least squares."""
    a = xtx.double() + ridge * torch.eye(xtx.shape[0], dtype=torch.float64, device=xtx.device)  # [C, C]
    try:
        return torch.linalg.solve(a, xtd.double())  # [C, C]
    except RuntimeError:  # singular: minimum-norm solution
        return torch.linalg.lstsq(a.cpu(), xtd.double().cpu(), driver="gelsd").solution.to(xtx.device)


def ghosted_operator(xtx: torch.Tensor, xtd: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """W* = I + M with (X^T X + eps I) M = X^T (X_post - X_pre). xtx, xtd: [C, C] -> [C, C] float64."""
    return torch.eye(xtx.shape[0], dtype=torch.float64, device=xtx.device) + ridge_solve(xtx, xtd, eps)


def operator_boundaries(removed: list[int], mode: str) -> list[tuple[int, int]]:
    """The (s, e) pairs to fit: maximal blocks, or one per removed layer (l, l + 1)."""
    if mode == "auto":
        mode = "per_block" if len(contiguous_blocks(removed)) <= 1 else "per_layer"
    return contiguous_blocks(removed) if mode == "per_block" else [(i, i + 1) for i in removed]


class Ghosted:
    name = "ghosted"
    requires_depth = True  # repairs removed layers: needs a depth-pruning report
    streamable = True  # boundary states through the layer runner; operators are small and resident

    def __init__(self, nsamples: int | None = 32, eps: float = 1e-6, operators: str = "auto"):
        if nsamples is not None and nsamples < 1:
            raise ConfigError("recovery.nsamples must be a positive number of sequences or null")
        if eps < 0:
            raise ConfigError("recovery.eps must be >= 0")
        if operators not in OPERATOR_MODES:
            raise ConfigError(f"recovery.operators must be one of {OPERATOR_MODES}, not {operators!r}")
        self.nsamples, self.eps, self.operators = nsamples, eps, operators

    def fit(self, ctx: RecoveryContext) -> tuple[list[tuple[int, int]], list[torch.Tensor], int]:
        """Operators [C, C] (float64) for each boundary, from the unpruned model; no change to it."""
        removed, _ = depth_report(ctx, self.name)
        boundaries = operator_boundaries(removed, self.operators)
        samples = calibration_subset(ctx, self.nsamples)
        if self.nsamples is not None and samples.shape[0] < self.nsamples:
            log.warning("ghosted: %d calibration sequences available, %d requested",
                        samples.shape[0], self.nsamples)
        stats = [NormalEquations() for _ in boundaries]

        def consume(k: int, batches: list) -> None:
            for b in batches:
                stats[k].update(b.x_pre, b.x_post - b.x_pre)  # [B, T, C] each

        if boundaries:
            collect(ctx, boundaries, samples, consume)
        return boundaries, [ghosted_operator(s.xtx, s.xtd, self.eps) for s in stats], int(samples.shape[0])

    def recover(self, ctx: RecoveryContext) -> dict[str, Any]:
        boundaries, operators, used = self.fit(ctx)
        removed, dense_layers = depth_report(ctx, self.name)
        loaded = ctx.prune.loaded
        sites = []
        for (s, e), w in zip(boundaries, operators):
            site = site_of(e, removed, len(dense_layers))
            attach(loaded.model, site, BoundaryOperator(w, "matrix", self.name), loaded.adapter)
            eye = torch.eye(w.shape[0], dtype=w.dtype, device=w.device)  # [C, C]
            sites.append({"block": [s, e], "site": site, "identity_distance": float((w - eye).norm())})
        return {"method": self.name, "operators": sites, "nsamples": used, "eps": self.eps,
                "added_parameters": sum(w.numel() for w in operators)}
