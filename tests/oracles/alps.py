"""Oracle for ALPS: ADMM for the layer-wise reconstruction problem, then the exact solve on its support.

Meng, Behdin, Wang & Mazumder, "ALPS: Improved Optimization for Highly Sparse One-Shot Pruning for
Large Language Models", NeurIPS 2024, written from the paper (section 3, Algorithm 1), in float64:
- the Gram matrix G = X^T X of the layer's dense inputs, damped by 1% of its mean diagonal and
  scaled to unit diagonal (s = sqrt(diag G)); the variable is B = (W s)^T, the target G B* with
  B* the dense B;
- ADMM: B = (G + rho I)^-1 (G B* - V + rho D) (a linear solve here, not an eigendecomposition),
  D = the projection of B + V / rho onto the support constraint (the k largest entries of the
  matrix, or N of every M consecutive inputs of an output), V += rho (B - D);
- rho starts at 0.1 and, every 3 iterations, grows by 1.3, 1.2 or 1.1 as the support still changes
  by more than 10%, 0.5% of k, or at all; the iterations stop once the support stopped changing
  after growing, or after iteration 30 with a change below 3e-4 of k;
- the final support is the top-k of B, and its weights the least-squares optimum on it (column by
  column, exactly: the paper's PCG post-processing converges to this).
For testing prunelab's `pruning=alps`; imports nothing from prunelab.
"""

from __future__ import annotations

import numpy as np
import torch


def project(values: torch.Tensor, keep: int, nm: tuple[int, int] | None) -> torch.Tensor:
    """values [in, out] with only the k largest |entries| (or N of every M inputs of an output) kept."""
    if nm is None:
        threshold_order = torch.argsort(values.abs().reshape(-1), descending=True)
        mask = torch.zeros(values.numel(), dtype=torch.bool)
        mask[threshold_order[:keep]] = True
        return values * mask.reshape(values.shape)
    n, m = nm
    groups = values.t().reshape(-1, m)  # [out * in / M, M]: M consecutive inputs of one output
    order = torch.argsort(groups.abs(), dim=1, descending=True)
    mask = torch.zeros_like(groups, dtype=torch.bool).scatter(1, order[:, :n], True)
    return (groups * mask).reshape(values.shape[1], values.shape[0]).t()


def alps(weight: torch.Tensor, gram: torch.Tensor, sparsity: float, nm: tuple[int, int] | None = None,
         max_iter: int = 300) -> torch.Tensor:
    """Pruned weight [out, in] (float64) for dense weight [out, in] and gram [in, in]."""
    W, G = weight.double(), gram.double().clone()
    G += 0.01 * torch.mean(torch.diag(G)) * torch.eye(G.shape[0], dtype=torch.float64)
    s = torch.sqrt(torch.diag(G)) + 1e-8
    G = G / s[:, None] / s[None, :]
    dense = (W * s).t()  # [in, out]
    target = G @ dense  # [in, out]
    keep = int(np.round((1 - sparsity) * dense.numel())) if nm is None else 0
    count = keep if nm is None else dense.numel() * nm[0] / nm[1]
    D = project(dense, keep, nm)
    V = torch.zeros_like(dense)
    rho, grown = 0.1, False
    support = D != 0
    eye = torch.eye(G.shape[0], dtype=torch.float64)
    B = dense
    for t in range(max_iter):
        B = torch.linalg.solve(G + rho * eye, target - V + rho * D)
        D = project(B + V / rho, keep, nm)
        V = V + rho * (B - D)
        if (t + 1) % 3:
            continue
        change = float((support != (D != 0)).sum()) / count
        support = D != 0
        if change > 0.1:
            rho, grown = rho * 1.3, True
        elif change > 0.005:
            rho, grown = rho * 1.2, True
        elif change > 0:
            rho = rho * 1.1 if grown else rho / 5
        elif grown:
            break
        else:
            rho /= 5
        rho = min(rho, 1e6)
        if t >= 30 and change < 3e-4:
            break
    B = project(B, keep, nm)
    for j in range(B.shape[1]):  # the least-squares optimum on each output's support
        rows = torch.nonzero(B[:, j]).flatten()
        if rows.numel():
            B[rows, j] = torch.linalg.solve(G[rows][:, rows], target[rows, j])
    return (B.t() / s).to(torch.float64)


def reconstruction_error(weight: torch.Tensor, dense: torch.Tensor, gram: torch.Tensor) -> float:
    """||X (W - W_dense)^T||_F^2 / ||X W_dense^T||_F^2 from the Gram matrix."""
    delta, dense, gram = (weight - dense).double(), dense.double(), gram.double()
    return float(torch.trace(delta @ gram @ delta.t()) / torch.trace(dense @ gram @ dense.t()))
