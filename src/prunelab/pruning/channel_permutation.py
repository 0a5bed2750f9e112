"""Channel permutation for N:M sparsity: choose which input channels share an m-group, so that the
n weights each group must lose cost less of the score.

RIA (Zhang et al., "Plug-and-Play", ICLR 2024, section 3.2) permutes the input channels before
taking the n lowest of every m, and maps the mask back: the mask is N:M in the permuted order (a
kernel that permutes the activations, or the previous layer's output rows, sees 2:4), not in the
stored one.
1. Heuristic channel reallocation: sort the channels by their summed score (ascending), cut the
   order into m equal segments, and deal segment i to position i of every group, every other
   segment reversed, so that each group gets one channel of each importance band.
2. Linear sum assignment (optional): for each position p of the group in turn, re-assign the
   channels at position p to groups so as to maximise the total score the N:M mask keeps
   (scipy's `linear_sum_assignment`, in blocks of channels with the reference's `--fast`).
The arithmetic is the reference's (biomedical-cybernetics/Relative-importance-and-activation-
pruning, `lib/prune.py`): its default (not stable) sorts, its segment bounds `int(C * i / m)`, its
scores summed in the scores' dtype.
"""

from __future__ import annotations

import torch
from scipy.optimize import linear_sum_assignment

from prunelab.pruning.masks import nm_mask


def reallocation_order(scores: torch.Tensor, m: int) -> torch.Tensor:
    """[in] the permuted channel order of the heuristic reallocation; scores: [out, in]."""
    columns = scores.shape[1]
    by_sum = torch.sort(torch.sum(scores, dim=0))[1]  # [in] ascending summed score
    order = torch.zeros_like(by_sum)
    for band in range(1, m + 1):
        segment = by_sum[int(columns * (band - 1) / m):int(columns * band / m)]
        order[band - 1::m] = segment if band % 2 == 1 else segment.flip(0)
    return order


def kept_score_matrix(scores: torch.Tensor, position: int, n: int, m: int) -> torch.Tensor:
    """[G, G] score kept by the N:M mask of group g when it takes position `position`'s channel of
    group j (its other m - 1 channels its own), for the G = in / m groups of `scores` [out, in]."""
    groups = scores.shape[1] // m
    others = torch.tensor([c for c in range(m) if c != position], device=scores.device)  # [m - 1]
    candidates = torch.arange(groups, device=scores.device) * m + position  # [G]
    kept = torch.zeros(groups, groups, dtype=scores.dtype, device=scores.device)
    for group in range(groups):
        strips = torch.empty(groups, m, dtype=torch.long, device=scores.device)  # [G, m]
        strips[:, 0] = candidates
        strips[:, 1:] = others + group * m
        values = scores[:, strips].transpose(0, 1)  # [G, out, m]
        lowest = torch.sort(values, dim=-1)[1][..., :n]  # [G, out, n]
        pruned = torch.zeros_like(values).scatter_(-1, lowest, 1)
        kept[group] = (values * (pruned == 0)).sum(dim=-1).sum(dim=-1)  # [G]
    return kept


def assignment_step(scores: torch.Tensor, position: int, n: int, m: int) -> torch.Tensor:
    """[in] a reordering of `scores`' columns that moves position `position`'s channels to the
    groups the linear sum assignment gives them."""
    groups = scores.shape[1] // m
    kept = kept_score_matrix(scores, position, n, m)  # [G, G]
    # scipy on the CPU: the assignment is a combinatorial solve, not tensor work
    chosen = torch.as_tensor(linear_sum_assignment(kept.cpu().numpy(), maximize=True)[1],
                             dtype=torch.long, device=scores.device)  # [G]
    order = torch.arange(scores.shape[1], device=scores.device)
    order[torch.arange(groups, device=scores.device) * m + position] = chosen * m + position
    return order


def assignment_order(scores: torch.Tensor, order: torch.Tensor, n: int, m: int, blocks: int = 1) -> torch.Tensor:
    """`order` refined by one linear sum assignment per group position, each over `blocks`
    consecutive slices of the order (the reference's `--fast`: 4 for attention, 8 for gate/up, 16
    for down)."""
    order = order.clone()
    size = len(order)
    for position in range(m):
        for block in range(blocks):
            part = slice(block * size // blocks, (block + 1) * size // blocks)
            within = order[part]
            order[part] = within[assignment_step(scores[:, within], position, n, m)]
    return order


def permuted_nm_mask(scores: torch.Tensor, n: int, m: int, order: torch.Tensor) -> torch.Tensor:
    """[out, in] True where pruned: N:M over the columns taken in `order`, mapped back."""
    mask = torch.zeros_like(scores, dtype=torch.bool)
    mask[:, order] = nm_mask(scores[:, order], n, m)
    return mask
