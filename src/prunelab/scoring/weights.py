"""Per-weight importance scores: pure functions of a weight matrix and calibration statistics."""

from __future__ import annotations

import torch


def magnitude_scores(weight: torch.Tensor) -> torch.Tensor:
    """|W|: the data-free baseline. weight: [out, in] -> [out, in]."""
    return weight.detach().abs().float()


def wanda_scores(weight: torch.Tensor, input_sq_norm: torch.Tensor) -> torch.Tensor:
    """Wanda's |W_ij| * ||X_j||_2 (Sun et al. 2023).

    Args:
        weight: [out, in] weight matrix.
        input_sq_norm: [in] mean over samples of each input channel's squared L2 norm over tokens
            (`calibration.SquaredColumnNorm`).
    """
    norm = input_sq_norm.float().to(weight.device).sqrt()  # [in]
    return weight.detach().abs().float() * norm.unsqueeze(0)  # [out, in]


def obs_scores(weight: torch.Tensor, hinv_diag: torch.Tensor) -> torch.Tensor:
    """SparseGPT's mask score w^2 / [Hinv]_jj^2, Hinv the upper Cholesky factor of H^-1.

    Args:
        weight: [out, cols] (the current, already-updated weights of the columns considered).
        hinv_diag: [cols] diagonal of the Cholesky factor for those columns.
    """
    return weight.float() ** 2 / hinv_diag.float().unsqueeze(0) ** 2  # [out, cols]


def ria_scores(weight: torch.Tensor, input_sq_norm: torch.Tensor, a: float = 0.5) -> torch.Tensor:
    """RIA's relative importance times activation (Zhang et al., "Plug-and-Play", ICLR 2024):
    RI_ij = |W_ij| / sum_k |W_kj| + |W_ij| / sum_k |W_ik| (the weight's share of its input
    channel's and of its output row's total), times ||X_j||_2 ** a.

    Args:
        weight: [out, in] weight matrix.
        input_sq_norm: [in] Wanda's running mean of ||X_j||^2 (`calibration.SquaredColumnNorm`).
        a: the activation exponent (the reference's `--a`, 0.5).
    The operations are the reference's, in its order (`torch.sqrt(s) ** a`, not `s ** (a / 2)`),
    so that equal inputs give equal scores to the last bit.
    """
    absolute = weight.detach().abs().float()  # [out, in]
    relative = absolute / absolute.sum(dim=0) + absolute / absolute.sum(dim=1).reshape(-1, 1)  # [out, in]
    return relative * torch.sqrt(input_sq_norm.float().to(weight.device).reshape(1, -1)) ** a  # [out, in]
