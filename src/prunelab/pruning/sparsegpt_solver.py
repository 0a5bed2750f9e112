"""The SparseGPT solver for one linear layer: pure tensor code, no hooks, no model.

Frantar & Alistarh, "SparseGPT: Massive Language Models Can Be Accurately Pruned in One-Shot", 2023.
Given W [out, in] and H = (2/n) sum X X^T [in, in], visit the columns left to right; each pruned
weight w_q is removed with the optimal brain surgeon update of the rest of its row,
W[:, q:] -= (w_q / Hinv_qq) Hinv[q, q:], where Hinv is the upper Cholesky factor of
(H + damp I)^-1 (its row q holds the inverse Hessian of the columns not yet visited).

Mask selection (`group`):
- block128 (the reference): at every 128-th column, the lowest w^2 / Hinv_jj^2 over the whole
  rows x 128 block of the already-updated weights (the reference's threshold quirk with
  `ties: reference`);
- row / matrix: one mask for the whole matrix chosen before the solve from the initial scores
  (exactly s of every row / one threshold per matrix);
- N:M: at every M-th column, the n lowest of the next m scores of each row, from the
  already-updated weights.
Updates are batched lazily: within a block of `blocksize` columns per column, then one matmul for
the rest of the matrix (mathematically the same as updating every column at each step).
"""

from __future__ import annotations

import torch

from prunelab.pruning.masks import GROUPS, nm_mask, unstructured_mask
from prunelab.scoring.weights import obs_scores

ADAPTIVE_WIDTH = 128  # the block128 mask group


def inverse_hessian_factor(hessian: torch.Tensor, percdamp: float = 0.01, overwrite: bool = False
                           ) -> tuple[torch.Tensor, torch.Tensor]:
    """(upper Cholesky factor of (H + damp I)^-1, dead-input mask), as the reference prepares it.

    Dead inputs (H_dd = 0: a channel that never fired) get H_dd = 1; damp = percdamp x mean diag H.
    hessian: [in, in]. `overwrite=True` damps and factors it in its own memory, as the reference
    does (H is lost; the factor is returned in its storage): one [in, in] matrix beside it at the
    peak instead of two, for a caller that prunes every linear fed by H with this one factor.
    """
    h = hessian.detach()
    if not (overwrite and h.dtype == torch.float32):
        h = h.clone().float()  # [in, in]
    dead = torch.diag(h) == 0  # [in]
    h[dead, dead] = 1
    index = torch.arange(h.shape[0], device=h.device)
    h[index, index] += percdamp * torch.mean(torch.diag(h))
    torch.linalg.cholesky(h, out=h)  # lower factor L of H + damp I, in place
    torch.cholesky_inverse(h, out=h)  # (H + damp I)^-1 = (L L^T)^-1
    torch.linalg.cholesky(h, upper=True, out=h)  # its upper factor
    return h, dead  # [in, in], [in]


def check_blocking(blocksize: int, group: str, nm: tuple[int, int] | None) -> None:
    """Adaptive mask groups must not straddle two lazy-update blocks."""
    width = nm[1] if nm else (ADAPTIVE_WIDTH if group == "block128" else 1)
    if blocksize <= 0 or blocksize % width:
        raise ValueError(f"blocksize={blocksize} must be a positive multiple of the mask group width {width}")


@torch.no_grad()
def sparsegpt_solve(weight: torch.Tensor, hessian: torch.Tensor, sparsity: float,
                    nm: tuple[int, int] | None = None, group: str = "block128", ties: str = "exact",
                    blocksize: int = 128, percdamp: float = 0.01) -> tuple[torch.Tensor, torch.Tensor]:
    """Prune one weight matrix and update the survivors to keep W X close to the dense output.

    Args:
        weight: [out, in] dense weights (not modified).
        hessian: [in, in] H = (2/n) sum X X^T of the layer's inputs (not modified).
        sparsity: fraction to prune (ignored for N:M).
        nm: (n, m) for N:M sparsity, None for unstructured.

    Returns:
        (pruned weights [out, in] fp32, mask [out, in] True where pruned).
    """
    factor = inverse_hessian_factor(hessian.to(weight.device), percdamp)
    return solve_with_factor(weight, factor, sparsity, nm, group, ties, blocksize)


@torch.no_grad()
def solve_with_factor(weight: torch.Tensor, factor: tuple[torch.Tensor, torch.Tensor], sparsity: float,
                      nm: tuple[int, int] | None = None, group: str = "block128", ties: str = "exact",
                      blocksize: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """`sparsegpt_solve` from `inverse_hessian_factor(H)`: the linears that read the same input
    (q, k, v; gate, up) share H and so its factor."""
    if group not in GROUPS:
        raise ValueError(f"group={group!r} is not one of {GROUPS}")
    check_blocking(blocksize, group, nm)
    w = weight.detach().clone().float()  # [out, in]
    rows, cols = w.shape
    hinv, dead = factor  # [in, in], [in]
    w[:, dead] = 0
    diag = torch.diag(hinv)  # [in]
    if nm is None and group != "block128":  # chosen once, before any update
        mask = unstructured_mask(obs_scores(w, diag), sparsity, group, ties)  # [out, in]
    else:
        mask = torch.zeros(rows, cols, dtype=torch.bool, device=w.device)  # [out, in], filled as we go
    width = nm[1] if nm else ADAPTIVE_WIDTH
    adaptive = nm is not None or group == "block128"
    # the two updates' products go to buffers made once: a fresh [out, b - i] product per column
    # costs an allocation (and, under a streamed run's allocator settings, page faults) per column
    outer = torch.empty(rows * min(blocksize, cols), dtype=w.dtype, device=w.device)
    rest = torch.empty(rows * max(cols - blocksize, 0), dtype=w.dtype, device=w.device)

    for i1 in range(0, cols, blocksize):
        i2 = min(i1 + blocksize, cols)
        w1 = w[:, i1:i2].clone()  # [out, b] updated as the block is visited
        q1 = torch.zeros_like(w1)  # [out, b] final values of the block
        err1 = torch.zeros_like(w1)  # [out, b] scaled errors for the lazy update
        hinv1 = hinv[i1:i2, i1:i2]  # [b, b]
        for i in range(i2 - i1):
            col = i1 + i
            if adaptive and col % width == 0 and sparsity > 0:
                scores = obs_scores(w1[:, i : i + width], diag[col : col + width])  # [out, <=width]
                chosen = nm_mask(scores, *nm) if nm else unstructured_mask(scores, sparsity, "matrix", ties)
                mask[:, col : col + scores.shape[1]] = chosen
            column = w1[:, i]  # [out]
            q = column.clone()
            q[mask[:, col]] = 0
            q1[:, i] = q
            e = (column - q) / hinv1[i, i]  # [out]
            w1[:, i:] -= torch.mm(e.unsqueeze(1), hinv1[i, i:].unsqueeze(0),
                                  out=_matrix(outer, rows, i2 - col))  # [out, b - i]
            err1[:, i] = e
        w[:, i1:i2] = q1
        if i2 < cols:  # lazy update of the rest
            w[:, i2:] -= torch.mm(err1, hinv[i1:i2, i2:], out=_matrix(rest, rows, cols - i2))  # [out, in - i2]
    return w, mask


def _matrix(buffer: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """A contiguous [rows, cols] view of the front of a flat buffer."""
    return buffer[: rows * cols].view(rows, cols)
