"""Orthogonal rotations for LinearPatch-R: Hadamard matrices of any hidden size we can build.

Construction: H_n = H_{2^k} (Sylvester) kron P_m, where P_m is a Paley matrix: Paley I for m = p + 1
with p prime and p = 3 (mod 4) (12, 20, 24, 32, 44, ...), Paley II for m = 2(p + 1) with p prime and
p = 1 (mod 4) (12, 28, 36, 60, ...). This covers every power of two and the common non-power-of-two
hidden sizes (3072 = 256 x 12, 3584 = 128 x 28, 5120 = 256 x 20, 2560 = 128 x 20, 1536, 768, ...).
For a size no such product reaches (n not a multiple of 4 above 2, or m needing a prime-power
field), we fall back to the orthonormal DCT-II basis: orthogonal but not +-1, which still spreads a
channel's outlier over all channels. `rotation(n)` reports which one it used.
"""

from __future__ import annotations

import math
from functools import lru_cache

import torch


def _is_prime(p: int) -> bool:
    return p >= 2 and all(p % d for d in range(2, math.isqrt(p) + 1))


def sylvester(n: int) -> torch.Tensor:
    """+-1 Hadamard matrix of order n = 2^k. -> [n, n] float64."""
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h


def _jacobsthal(p: int) -> torch.Tensor:
    """Q_ij = chi(j - i), chi the quadratic character mod the prime p. -> [p, p]."""
    squares = {(x * x) % p for x in range(1, p)}
    chi = torch.tensor([0.0] + [1.0 if a in squares else -1.0 for a in range(1, p)], dtype=torch.float64)
    idx = (torch.arange(p)[None, :] - torch.arange(p)[:, None]) % p  # [p, p]
    return chi[idx]


def paley(m: int) -> torch.Tensor | None:
    """+-1 Hadamard matrix of order m from a Paley construction over a prime field, or None."""
    p = m - 1
    if _is_prime(p) and p % 4 == 3:  # Paley I: H = I + [[0, 1^T], [-1, Q]]
        s = torch.zeros(m, m, dtype=torch.float64)
        s[0, 1:], s[1:, 0], s[1:, 1:] = 1.0, -1.0, _jacobsthal(p)
        return torch.eye(m, dtype=torch.float64) + s
    if m % 2 == 0:
        p = m // 2 - 1
        if _is_prime(p) and p % 4 == 1:  # Paley II: C (x) [[1,1],[1,-1]] + I (x) [[1,-1],[-1,-1]]
            c = torch.zeros(p + 1, p + 1, dtype=torch.float64)
            c[0, 1:], c[1:, 0], c[1:, 1:] = 1.0, 1.0, _jacobsthal(p)
            a = torch.tensor([[1.0, 1.0], [1.0, -1.0]], dtype=torch.float64)
            b = torch.tensor([[1.0, -1.0], [-1.0, -1.0]], dtype=torch.float64)
            return torch.kron(c, a) + torch.kron(torch.eye(p + 1, dtype=torch.float64), b)
    return None


@lru_cache(maxsize=8)
def _hadamard(n: int) -> torch.Tensor | None:
    power = 1
    while n % (power * 2) == 0:
        power *= 2
    while power >= 1:  # largest Sylvester factor first
        m = n // power
        core = torch.ones(1, 1, dtype=torch.float64) if m == 1 else (paley(m) if m > 2 else None)
        if core is not None:
            return torch.kron(sylvester(power), core)
        power //= 2
    return None


def hadamard_matrix(n: int) -> torch.Tensor | None:
    """+-1 matrix H [n, n] with H H^T = n I (float64), or None when no construction here covers n."""
    h = _hadamard(n)
    return None if h is None else h.clone()


def dct_basis(n: int) -> torch.Tensor:
    """Orthonormal DCT-II matrix [n, n] (float64): rows are the cosine basis vectors."""
    k = torch.arange(n, dtype=torch.float64)[:, None]  # [n, 1]
    i = torch.arange(n, dtype=torch.float64)[None, :]  # [1, n]
    d = torch.cos(math.pi * (i + 0.5) * k / n) * math.sqrt(2.0 / n)  # [n, n]
    d[0] /= math.sqrt(2.0)
    return d


def rotation(n: int) -> tuple[torch.Tensor, str]:
    """An orthogonal Q [n, n] (float64, Q Q^T = I) and its kind: "hadamard" or "dct"."""
    h = hadamard_matrix(n)
    if h is not None:
        return h / math.sqrt(n), "hadamard"
    return dct_basis(n), "dct"
