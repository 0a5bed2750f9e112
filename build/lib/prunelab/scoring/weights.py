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
