"""ALPS's layer-wise solve: ADMM on the reconstruction objective, then a conjugate-gradient polish.

Meng, Behdin, Wang & Mazumder, "ALPS: Improved Optimization for Highly Sparse One-Shot Pruning for
Large Language Models", NeurIPS 2024. For one linear with dense weights W [out, in] and the input
Gram matrix G = X^T X [in, in] summed over the calibration tokens:

    minimise_B  || X W^T - X B ||_F^2   subject to  B having at most k non-zeros  (or N:M)

1. Damp G by 1% of its mean diagonal and scale it to unit diagonal, G_ij / (s_i s_j) with s the
   square roots of its diagonal; the variables are then B = (W s)^T [in, out] (so the starting
   support, the largest |B|, is Wanda-like |W| sqrt(G_jj + damp)).
2. ADMM splits B (least squares, a ridge solve with (G + rho I)^-1 from one eigendecomposition) from
   D (projection onto the support constraint, a top-k); the penalty rho starts at 0.1 and grows
   every 3 iterations by 1.3, 1.2 or 1.1 with how much the support still changes, until it
   settles (after 30 iterations, a change below 3e-4 of k).
3. On the final support (the top-k of B) 10 iterations of conjugate gradient refine the kept
   weights against G B = W s G.

`alps_solve` follows the official code (mazumder-lab/ALPS `alps.py`, `ALPS_prune.ALPS_admm` and
`cg_batch`) operation for operation: the float64 eigendecomposition with the inverse cast to
float32, the /5 restart branch and the 1e6 cap on rho, `np.round` for k, and the CG's stopping test
on the unmasked residual norm per row of G B (so it nearly always runs its 10 iterations). Its
printed-only error estimates are computed once at the end, for the record. One operation differs
and gives the same result: the projection's top-k, a selection by `kthvalue` where the boundary
is untied (`_smallest_squares`; the official `topk` itself otherwise).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from prunelab.errors import ConfigError


@dataclass(frozen=True)
class AdmmSettings:
    """The official defaults: `rho` 0.1 (hard-coded in its `llama_sequential`; its `--rho` option
    only names output files), up to 300 iterations, the penalty updated every 3, the stopping test
    from iteration 30; 10 CG iterations at relative tolerance 1e-4; damping 1% of mean diag(G)."""

    rho: float = 0.1
    max_iter: int = 300
    update_iter: int = 3
    switch_iter: int = 30
    cg_iter: int = 10
    cg_rtol: float = 1e-4
    percdamp: float = 0.01

    def check(self) -> None:
        if not self.rho > 0:
            raise ConfigError(f"pruning.rho={self.rho}: ADMM's penalty must be > 0")
        if self.max_iter < 1 or self.update_iter < 1:
            raise ConfigError(f"pruning.max_iter={self.max_iter}, pruning.update_iter={self.update_iter}: "
                              "ADMM needs at least one iteration and an update period of at least 1")
        if self.cg_iter < 0 or not self.cg_rtol > 0:
            raise ConfigError(f"pruning.cg_iter={self.cg_iter}, pruning.cg_rtol={self.cg_rtol}: "
                              "use cg_iter >= 0 and cg_rtol > 0")
        if self.percdamp < 0:
            raise ConfigError(f"pruning.percdamp={self.percdamp} must be >= 0")


@dataclass
class AlpsSolve:
    """What one linear's solve did: the record's per-linear cost and fit."""

    weight: torch.Tensor  # [out, in], pruned and refined, float32
    iterations: int  # ADMM iterations run
    final_rho: float
    error_admm: float  # relative reconstruction error on the ADMM support, before CG
    error: float  # after CG
    admm_seconds: float
    cg_seconds: float


def _project(values: torch.Tensor, keep: int, nm: tuple[int, int] | None, shape: tuple[int, int]) -> torch.Tensor:
    """`values` [in, out] with all but the support zeroed: the `keep` largest |v| of the whole
    matrix, or of every N:M group (M consecutive inputs of one output), as the official code does
    it (top-k of -v^2, then zeros written at those indices)."""
    inputs, outputs = shape
    if nm is None:
        flat = values.clone().reshape(-1) if values.is_contiguous() else values.reshape(-1)  # a copy
        flat[_smallest_squares(flat, inputs * outputs - keep)] = 0
        return flat.reshape(inputs, outputs)
    n, m = nm
    groups = values.t().reshape((inputs * outputs // m, m))  # [out * in / M, M]
    _, drop = torch.topk(-groups ** 2, m - n, dim=1)
    groups = groups.scatter(src=torch.zeros((groups.shape[0], m - n), device=values.device), dim=1, index=drop)
    return groups.reshape(outputs, inputs).t()  # [in, out]


def _smallest_squares(flat: torch.Tensor, count: int) -> torch.Tensor:
    """What the official `topk(-v^2, count)` zeroes: the `count` entries of smallest square.

    ADMM projects every iteration, and a top-k of half a matrix is a sort (0.1 s for a 576 x 1536
    linear on one CPU thread, most of ALPS's time). Where the count-th smallest square is not tied
    with the next one, those entries are exactly the squares up to it: one selection (`kthvalue`,
    about 7x faster) gives them as a mask. A tie across that boundary, or a NaN, takes the
    official top-k itself, so the entries zeroed are always the official ones.
    """
    squares = flat ** 2
    if count <= 0 or count >= squares.numel():
        return torch.full_like(squares, count > 0, dtype=torch.bool)
    threshold = torch.kthvalue(squares, count).values
    mask = squares <= threshold
    if int(mask.sum()) == count and not bool(torch.isnan(threshold)) and not bool(squares.isnan().any()):
        return mask
    return torch.topk(-squares, count).indices


def _nm_support(values: torch.Tensor, nm: tuple[int, int]) -> torch.Tensor:
    """The zero pattern the official N:M branch tracks: [out * in / M, M] floats."""
    inputs, outputs = values.shape
    return (values.t().reshape((inputs * outputs // nm[1], nm[1])) == 0).to(torch.float)


def _ridge_inverse(eigenvalues: torch.Tensor, eigenvectors: torch.Tensor, rho: float) -> torch.Tensor:
    """(G + rho I)^-1 from G's float64 eigendecomposition, cast to float32."""
    return (eigenvectors @ ((1 / (eigenvalues + rho)) * eigenvectors).T).float()


def alps_solve(weight: torch.Tensor, gram: torch.Tensor, sparsity: float, nm: tuple[int, int] | None = None,
               settings: AdmmSettings = AdmmSettings()) -> AlpsSolve:
    """ALPS for one linear: weight [out, in], gram = X^T X [in, in] (float32, not modified);
    sparsity the fraction of the matrix to zero (ignored for N:M, which keeps N of every M)."""
    start = time.perf_counter()
    device = weight.device
    W = weight.detach().float()  # [out, in]
    G = gram.detach().float().cpu().clone()  # [in, in], on the CPU on purpose: the official code moves X^T X there (float64 eigh)
    damp = settings.percdamp * torch.mean(torch.diag(G)).item()
    diag = torch.arange(G.shape[0], device=G.device)
    G[diag, diag] += damp
    scale = torch.diag(G).sqrt() + 1e-8  # [in]
    G = G / scale
    G = (G.T / scale).T  # unit diagonal
    target = torch.matmul(W.cpu() * scale, G).to(device)  # [out, in]: (W s) G, the "YtX"
    B = (W * scale.to(device)).t().clone()  # [in, out]
    B_orig = B.cpu().clone()
    V = torch.zeros_like(B)
    inputs, outputs = B.shape
    eigenvalues, eigenvectors = torch.linalg.eigh(G.double())
    rho = settings.rho
    inverse = _ridge_inverse(eigenvalues, eigenvectors, rho).to(device)
    if nm is None:
        keep = int(np.round((1 - sparsity) * inputs * outputs))
        D = _project(B, keep, None, (inputs, outputs))
        support_before = (D.reshape(-1) == 0).to(torch.float)
        kept = keep
    else:
        keep, kept = 0, inputs * outputs * nm[0] / nm[1]
        D = _project(B, 0, nm, (inputs, outputs))
        support_before = _nm_support(D, nm)
    D_init = D.clone()
    target_t = target.T
    grew = False
    iterations = 0
    for step in range(settings.max_iter):
        iterations = step + 1
        B = inverse @ (target_t - V + rho * D)
        D = _project((V + rho * B) / rho, keep, nm, (inputs, outputs))
        V = V + rho * (B - D)
        if (step + 1) % settings.update_iter:
            continue
        support = (D.reshape(-1) == 0).to(torch.float) if nm is None else _nm_support(D, nm)
        change = torch.sum((support - support_before) ** 2)
        if change / kept > 0.1:
            grew, rho = True, rho * 1.3
        elif change / kept > 0.005:
            grew, rho = True, rho * 1.2
        elif change > 0.5:
            if grew:
                rho *= 1.1
            else:  # the official restart: a smaller penalty from the start
                rho /= 5
                B = B_orig.clone().to(device)
                D = D_init.clone().to(device)
                V = torch.zeros_like(B).to(device)  # laid out like the restarted B, as there
        elif grew:
            break
        else:
            rho /= 5
        support_before = support.clone()
        rho = min(rho, 1e6)
        inverse = _ridge_inverse(eigenvalues, eigenvectors, rho).to(device)
        if step >= settings.switch_iter and change / kept < 0.0003:
            break
    B = _project(B, keep, nm, (inputs, outputs))
    error_admm = _relative_error(G, B, B_orig, target)
    admm_seconds = time.perf_counter() - start
    start = time.perf_counter()
    B = masked_cg(G.to(device), target_t, (B != 0).to(torch.float), B, settings.cg_rtol, settings.cg_iter)
    cg_seconds = time.perf_counter() - start
    pruned = (B.t() / scale.to(device)).reshape(weight.shape)  # [out, in]
    return AlpsSolve(pruned, iterations, rho, error_admm, _relative_error(G, B, B_orig, target),
                     admm_seconds, cg_seconds)


def _relative_error(G: torch.Tensor, B: torch.Tensor, B_orig: torch.Tensor, target: torch.Tensor) -> float:
    """The official error estimate sum_ij (B - B0)_ij (G B - target^T)_ij / sum(B0 * target^T)
    (its diagonal of a product, summed without forming the [out, out] product)."""
    B, target = B.cpu(), target.cpu()
    residual = torch.matmul(G, B) - target.T  # [in, out]
    return float(torch.sum((B - B_orig) * residual) / torch.sum(B_orig * target.T))


def masked_cg(A: torch.Tensor, rhs: torch.Tensor, support: torch.Tensor, X0: torch.Tensor, rtol: float,
              maxiter: int) -> torch.Tensor:
    """Conjugate gradient for A X = rhs with X kept on `support` (residuals masked), from X0:
    the official `cg_batch` without preconditioner (A [n, n], rhs, support, X0 [n, m]), every
    column a system of its own. Stops once every row of A X - rhs has norm <= rtol x that row's
    norm of rhs (the official test, on the unmasked residual), or after `maxiter` iterations."""
    X = X0
    R = (rhs - A @ X) * support
    Z, P = R, torch.zeros_like(R)
    R1 = R
    bound = rtol * torch.norm(rhs, dim=1)  # [n]
    for k in range(1, maxiter + 1):
        Z = R
        if k == 1:
            P, R1, Z1, X1 = Z, R, Z, X
        else:
            R2, Z2, P1 = R1, Z1, P
            R1, Z1, X1 = R, Z, X
            denominator = (R2 * Z2).sum(0)
            denominator[denominator == 0] = 1e-8
            P = Z1 + ((R1 * Z1).sum(0) / denominator).unsqueeze(0) * P1
        AP = A @ P
        denominator = (P * AP).sum(0)
        denominator[denominator == 0] = 1e-8
        alpha = ((R1 * Z1).sum(0) / denominator).unsqueeze(0)
        X = X1 + alpha * P
        R = (R1 - alpha * AP) * support
        if (torch.norm(A @ X - rhs, dim=1) <= bound).all():
            break
    return X
