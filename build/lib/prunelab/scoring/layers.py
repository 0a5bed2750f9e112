"""Layer scores for depth pruning: pure functions of hidden states or block weights.

Notation: h_l is the hidden state entering decoder layer l ([B, T, C] per calibration batch); h_L is
the state after the last layer, before the final norm. Every function here is math on tensors; the
loops that produce h_l live in `prunelab.calibration.hidden_states`.

Convention: the depth selectors remove the LOWEST scores first, so every score here is "importance"
(a distance, an NLL, a weight mass), never a similarity.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
import torch.nn.functional as F

COSINE_DIMS = ("hidden", "tokens")
TOKEN_SETS = ("last", "all")


def cosine_terms(a: torch.Tensor, b: torch.Tensor, cosine_dim: str = "hidden") -> torch.Tensor:
    """Cosines between two hidden states, one per token (or per channel for the quirk).

    Args:
        a, b: [B, T, C] hidden states of the same tokens.
        cosine_dim: "hidden" (faithful: cosine over C, one value per token) or "tokens" (the
            LinearPatch / Ghosted code: `cosine_similarity` with its default dim=1 on [B, T, C],
            a cosine over the T tokens, one value per channel).

    Returns: [B * T] (hidden) or [B * C] (tokens) cosines in float32.
    """
    if cosine_dim not in COSINE_DIMS:
        raise ValueError(f"cosine_dim must be one of {COSINE_DIMS}, not {cosine_dim!r}")
    dim = -1 if cosine_dim == "hidden" else 1
    return F.cosine_similarity(a.float(), b.float(), dim=dim).reshape(-1)  # [B*T] or [B*C]


def block_influence(h_in: torch.Tensor, h_out: torch.Tensor, cosine_dim: str = "hidden") -> torch.Tensor:
    """ShortGPT block influence of one layer on one batch: BI = 1 - mean cos(h_l, h_{l+1}).

    h_in, h_out: [B, T, C]. Returns a scalar tensor.
    """
    return 1.0 - cosine_terms(h_in, h_out, cosine_dim).mean()


def last_token(h: torch.Tensor) -> torch.Tensor:
    """[B, T, C] -> [B, C]: the last position (calibration windows are unpadded)."""
    return h[:, -1, :]


def select_tokens(h: torch.Tensor, tokens: str) -> torch.Tensor:
    """[B, T, C] -> [N, C] rows the angular distance is measured on (last token or all tokens)."""
    if tokens not in TOKEN_SETS:
        raise ValueError(f"tokens must be one of {TOKEN_SETS}, not {tokens!r}")
    return last_token(h) if tokens == "last" else h.reshape(-1, h.shape[-1])  # [N, C]


def angular_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Gromov et al.: d = arccos(cos(a, b)) / pi per row. a, b: [N, C] -> [N] in [0, 1]."""
    cos = F.cosine_similarity(a.float(), b.float(), dim=-1).clamp(-1.0, 1.0)  # [N]
    return torch.arccos(cos) / math.pi  # [N]


def nll_from_logits(logits: torch.Tensor, ids: torch.Tensor) -> tuple[float, int]:
    """Summed next-token NLL and the number of predicted tokens.

    logits: [B, T, V]; ids: [B, T] token ids (position t predicts t + 1).
    """
    shift = logits[:, :-1, :].float().reshape(-1, logits.shape[-1])  # [B*(T-1), V]
    target = ids[:, 1:].reshape(-1).to(shift.device)  # [B*(T-1)]
    return float(F.cross_entropy(shift, target, reduction="sum")), int(target.numel())


def weight_magnitude(weights: Iterable[torch.Tensor]) -> float:
    """Shortened LLaMA "Magnitude": sum of |W| over a block's weight matrices (forward-free)."""
    return float(sum(w.detach().float().abs().sum() for w in weights))


def taylor_importance(weights: Iterable[torch.Tensor], grads: Iterable[torch.Tensor]) -> float:
    """Shortened LLaMA "Taylor": sum of |W * dL/dW| over a block's weight matrices.

    weights, grads: matching [out, in] tensors (grads accumulated over the calibration batches).
    """
    return float(sum((w.detach().float() * g.float()).abs().sum() for w, g in zip(weights, grads)))


class RunningMean:
    """Mean of values arriving in chunks (tensors of any shape), exact over all elements."""

    def __init__(self) -> None:
        self.total = 0.0
        self.count = 0

    def update(self, values: torch.Tensor) -> None:
        self.total += float(values.double().sum())
        self.count += values.numel()

    @property
    def value(self) -> float:
        return self.total / self.count if self.count else float("nan")
