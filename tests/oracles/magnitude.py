"""Oracle for magnitude pruning, as the Wanda repository runs its magnitude baseline.

Sun, Liu, Bair & Kolter, "A Simple and Effective Pruning Approach for Large Language Models", 2023
(locuslab/wanda, `--prune_method magnitude`), after Han et al. 2015. Data-free: for every linear of
every decoder layer, score |W|;
- unstructured: one threshold per matrix, the score at 0-based position k = int(numel * s) of the
  sorted flattened scores, and every score <= that threshold is pruned (k + 1 entries plus ties);
- N:M: in each row, the n lowest of every m consecutive inputs (torch.topk, largest=False).

For testing prunelab's `pruning=magnitude` against the protocol; imports nothing from prunelab.
"""

from __future__ import annotations

import torch
from torch import nn

from oracles.llama_layers import decoder_linears


def threshold_mask(scores: torch.Tensor, sparsity: float) -> torch.Tensor:
    """True where pruned: every score <= the int(numel * s)-th smallest (0-based) of the matrix."""
    k = int(scores.numel() * sparsity)
    threshold = torch.sort(scores.flatten())[0][k]
    return scores <= threshold


def n_of_m_mask(scores: torch.Tensor, n: int, m: int) -> torch.Tensor:
    """True where pruned: the n lowest scores of every m consecutive columns, group by group."""
    mask = torch.zeros_like(scores, dtype=torch.bool)
    for start in range(0, scores.shape[1], m):
        group = scores[:, start : start + m].float()  # [out, m]
        lowest = torch.topk(group, n, dim=1, largest=False)[1]  # [out, n] column within the group
        mask.scatter_(1, start + lowest, True)
    return mask


@torch.no_grad()
def magnitude_oracle(model: nn.Module, token_ids: torch.Tensor | None = None, sparsity: float = 0.5,
                     nm: tuple[int, int] | None = None) -> None:
    """Prune `model` (a Hugging Face Llama) in place; `token_ids` is ignored (data-free)."""
    for layer in model.model.layers:
        for linear in decoder_linears(layer).values():
            weight = linear.weight.data
            scores = torch.abs(weight)
            mask = n_of_m_mask(scores, *nm) if nm else threshold_mask(scores, sparsity)
            weight[mask] = 0
