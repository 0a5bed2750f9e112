"""SliceGPT's arithmetic: PCA of a residual-stream signal, the random final orientation, the
sliced dimension.

Ashkboos, Croci, do Nascimento, Hoefler & Hensman, "SliceGPT: Compress Large Language Models by
Deleting Rows and Columns", ICLR 2024 (microsoft/TransformerCompression, `src/slicegpt/rotate.py`).
Kept exactly as the reference computes it, so that eigenvalues match to rounding:
- `pca_calc`: H = sum over batches and tokens of X^T X in float64, uncentred and NOT divided by
  the token count, damped by 0.01 * mean(diag H), `torch.linalg.eigh`, sorted by descending
  eigenvalue (the damped eigenvalues are returned, as the reference does);
- `random_orthogonal_upper_left`: Q of the QR of a uniform [0, 1) matrix, from a NumPy legacy
  RandomState (the reference calls the unseeded global `np.random.rand`: seeded here, so a run is
  reproducible and equals the reference run after `np.random.seed(seed)`);
- `sliced_dimension`: int((1 - sparsity) * hidden), rounded down to a multiple of round_interval.
"""

from __future__ import annotations

import numpy as np
import torch

from prunelab.errors import ConfigError


@torch.no_grad()
def pca_calc(signals: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """(eigenvalues [C] descending, eigenvectors [C, C] as columns) of the damped uncentred
    second moment of `signals` (per batch [B, T, C]), in float64."""
    H = None
    for X in signals:
        X = X.double()  # [B, T, C]
        H_batch = torch.sum(X.mT @ X, dim=0)  # [C, C], summed over the batch
        H = H_batch if H is None else H + H_batch
    damp = 0.01 * torch.mean(torch.diag(H))
    diag = torch.arange(H.shape[-1], device=H.device)
    H[diag, diag] = H[diag, diag] + damp
    values, vectors = torch.linalg.eigh(H)
    index = torch.argsort(values, descending=True)
    return values[index], vectors[:, index]


def random_orthogonal_upper_left(total_dim: int, upper_block_dim: int, rng: np.random.RandomState) -> torch.Tensor:
    """[total, total] float64: a random orthogonal upper-left block of `upper_block_dim`, identity
    elsewhere (rotates the kept directions among themselves, so slicing is unchanged)."""
    A = rng.rand(upper_block_dim, upper_block_dim)
    Q, _ = np.linalg.qr(A)
    R = np.eye(total_dim)
    R[:upper_block_dim, :upper_block_dim] = Q
    return torch.from_numpy(R)


def sliced_dimension(hidden: int, sparsity: float, round_interval: int) -> int:
    """The kept embedding dimension (experiments/run_slicegpt.py); one line when nothing is left."""
    dim = int((1 - sparsity) * hidden)
    dim -= dim % round_interval
    if dim <= 0:
        raise ConfigError(f"SliceGPT at sparsity {sparsity} with round_interval {round_interval} would keep "
                          f"no dimension of the hidden size {hidden}")
    return dim
