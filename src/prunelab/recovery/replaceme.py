"""ReplaceMe: fold a linear replacement of the removed block into the previous MLP's output.

Shi et al., "ReplaceMe: Network Simplification via Layer Pruning and Linear Transformations", 2025.
For each removed block [s, e), on the UNPRUNED model's calibration tokens:
  1. M = MLP output of layer s - 1, Y = h_s - M (what layer s - 1 adds besides its MLP), X_post = h_e.
  2. LSTSQ: T = argmin ||M T - (X_post - Y)|| by float64 normal equations with ridge alpha (default 0);
     cosine: T minimises 1 - cos(M T, X_post - Y) with Adam (lr 1e-4, 10 epochs, 1024-token
     batches, T initialised to the identity).
  3. Merge: W_down <- T^T W_down (and b <- b T where the projection has a bias). No added parameters.
Select with `recovery=replaceme` (LSTSQ) or `recovery=replaceme_cosine`. A block starting at
layer 0 has no MLP before it: ReplaceMe never prunes layer 0 (use `pruning.protect_first=1`).
The cosine variant keeps M and X_post - Y of every calibration token in memory, as the reference does.
A model whose MLP output passes a post-norm before the residual (Gemma 3) is refused before any work:
the fold in step 3 would then be rescaled by that norm, token by token, and no longer be M T.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from prunelab.errors import ConfigError, UnsupportedModelError
from prunelab.models.adapter import ModelAdapter
from prunelab.models.width import model_name
from prunelab.recovery.base import RecoveryContext
from prunelab.recovery.boundary import calibration_subset, collect, contiguous_blocks, depth_report
from prunelab.recovery.ghosted import NormalEquations, ridge_solve


def replaceme_target(x_pre: torch.Tensor, x_post: torch.Tensor, mlp_out: torch.Tensor) -> torch.Tensor:
    """X_post - Y with Y = h_s - M: what M T must produce. All [..., C]."""
    return x_post - (x_pre - mlp_out)


def fit_cosine_transform(m: torch.Tensor, target: torch.Tensor, lr: float = 1e-4, epochs: int = 10,
                         batch_tokens: int = 1024, seed: int = 0) -> torch.Tensor:
    """T [C, C] minimising mean over tokens of 1 - cos(m T, target); m, target: [N, C]."""
    c = m.shape[-1]
    t = nn.Parameter(torch.eye(c, dtype=torch.float32, device=m.device))  # [C, C]
    optimizer = torch.optim.Adam([t], lr=lr)
    generator = torch.Generator().manual_seed(seed)
    with torch.enable_grad():
        for _ in range(epochs):
            for idx in torch.randperm(m.shape[0], generator=generator).split(batch_tokens):
                pred = m[idx].float() @ t  # [b, C]
                loss = (1.0 - F.cosine_similarity(pred, target[idx].float(), dim=-1)).mean()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
    return t.detach().double()


@torch.no_grad()
def merge_transform(linear: nn.Linear, t: torch.Tensor) -> None:
    """Fold y <- y T into the output projection: W <- T^T W ([C, F]), b <- b T ([C])."""
    w = linear.weight
    t = t.to(w.device, torch.float64)
    w.copy_((t.T @ w.double()).to(w.dtype))  # [C, F]
    if linear.bias is not None:
        linear.bias.copy_((linear.bias.double() @ t).to(linear.bias.dtype))  # [C]


class _ReplaceMe:
    name = "replaceme"
    requires_depth = True  # repairs removed layers: needs a depth-pruning report
    streamable = True  # boundary states through the layer runner, the transform merged into one layer
    objective = "lstsq"

    def __init__(self, nsamples: int | None = None):
        if nsamples is not None and nsamples < 1:
            raise ConfigError("recovery.nsamples must be a positive number of sequences or null")
        self.nsamples = nsamples

    def check_model(self, adapter: ModelAdapter, name: str | None = None) -> None:
        """Refuse a model whose MLP output is normalised before it joins the residual (Gemma 3)."""
        if not adapter.mlp_output_joins_residual:
            raise UnsupportedModelError(
                f"{self.name} cannot repair {model_name(adapter, name)}: its MLP output passes a post-norm "
                "before the residual, so a transform folded into the MLP output projection is renormalised "
                "token by token instead of acting as M T; use recovery=linear_patch_r, linear_patch_d or ghosted")

    def solve(self, stats: Any, seed: int) -> torch.Tensor:
        raise NotImplementedError

    def new_stats(self) -> Any:
        raise NotImplementedError

    def fit(self, ctx: RecoveryContext) -> tuple[list[tuple[int, int]], list[torch.Tensor]]:
        """One T [C, C] (float64) per removed block, from the unpruned model; no change to it."""
        self.check_model(ctx.prune.loaded.adapter)
        removed, _ = depth_report(ctx, self.name)
        blocks = contiguous_blocks(removed)
        if blocks and blocks[0][0] == 0:
            raise ConfigError("ReplaceMe merges into layer s - 1, so it cannot repair a block starting "
                              "at layer 0; set pruning.protect_first=1")
        stats = [self.new_stats() for _ in blocks]

        def consume(k: int, batches: list) -> None:
            for b in batches:
                stats[k].update(b.mlp_out, replaceme_target(b.x_pre, b.x_post, b.mlp_out))  # [B, T, C]

        if blocks:
            collect(ctx, blocks, calibration_subset(ctx, self.nsamples), consume, mlp_outputs=True)
        return blocks, [self.solve(s, ctx.prune.seed) for s in stats]

    def recover(self, ctx: RecoveryContext) -> dict[str, Any]:
        blocks, transforms = self.fit(ctx)
        removed, _ = depth_report(ctx, self.name)
        adapter = ctx.prune.loaded.adapter
        merged = []
        for (s, e), t in zip(blocks, transforms):
            new_index = (s - 1) - sum(1 for i in removed if i < s - 1)  # layer s - 1 after removal
            with adapter.layer_in_memory(new_index) as layer:  # streamed: read, merged, written back
                merge_transform(adapter.residual_writers(layer)[1], t)
            merged.append({"block": [s, e], "merged_into_layer": new_index,
                           "identity_distance": float((t - torch.eye(t.shape[0], dtype=t.dtype,
                                                                     device=t.device)).norm())})
        return {"method": self.name, "objective": self.objective, "merged": merged, "added_parameters": 0}


class ReplaceMe(_ReplaceMe):
    """LSTSQ objective (`recovery=replaceme`)."""

    def __init__(self, ridge: float = 0.0, nsamples: int | None = None):
        super().__init__(nsamples)
        if ridge < 0:
            raise ConfigError("recovery.ridge must be >= 0")
        self.ridge = ridge

    def new_stats(self) -> NormalEquations:
        return NormalEquations()

    def solve(self, stats: NormalEquations, seed: int) -> torch.Tensor:
        return ridge_solve(stats.xtx, stats.xtd, self.ridge)  # [C, C]


class _Rows:
    def __init__(self) -> None:
        self.m: list[torch.Tensor] = []
        self.target: list[torch.Tensor] = []

    def update(self, m: torch.Tensor, target: torch.Tensor) -> None:
        self.m.append(m.reshape(-1, m.shape[-1]).float())  # [B*T, C]
        self.target.append(target.reshape(-1, target.shape[-1]).float())  # [B*T, C]


class ReplaceMeCosine(_ReplaceMe):
    """Cosine objective (`recovery=replaceme_cosine`)."""

    name = "replaceme_cosine"
    objective = "cosine"

    def __init__(self, lr: float = 1e-4, epochs: int = 10, batch_tokens: int = 1024,
                 nsamples: int | None = None):
        super().__init__(nsamples)
        if lr <= 0 or epochs < 1 or batch_tokens < 1:
            raise ConfigError("recovery.lr must be > 0, recovery.epochs and recovery.batch_tokens >= 1")
        self.lr, self.epochs, self.batch_tokens = lr, epochs, batch_tokens

    def new_stats(self) -> _Rows:
        return _Rows()

    def solve(self, stats: _Rows, seed: int) -> torch.Tensor:
        return fit_cosine_transform(torch.cat(stats.m), torch.cat(stats.target), self.lr, self.epochs,
                                    self.batch_tokens, seed)  # [C, C]
