"""Pruning masks from scores: pure tensor functions. A mask is True where a weight is pruned.

Comparison groups (which weights compete for the kept slots):
- matrix: one threshold per weight matrix (magnitude's reference default);
- row: exactly s of every output row (Wanda's reference default);
- block128: one threshold per 128-column block over all rows (SparseGPT's unstructured mask).

Ties: `exact` prunes exactly k = floor(s x group size) entries, lowest scores first, ties broken by
position (stable sort): Wanda's reference rule (per row). `reference` is the magnitude and
SparseGPT references' threshold rule: everything <= the k-th smallest score (0-based index k) is
pruned, i.e. k + 1 entries and every tie. Each method's default is its own reference's rule.
N:M prunes the n lowest of every m consecutive input weights of a row, ties in torch.topk order.
"""

from __future__ import annotations

import re

import torch

from prunelab.errors import ConfigError
from prunelab.models.memory import ROW_CHUNK_ENTRIES

GROUPS = ("matrix", "row", "block128")
TIES = ("exact", "reference")


def parse_sparsity_type(sparsity_type: str) -> tuple[int, int] | None:
    """None for unstructured, (n, m) for "n:m"."""
    if sparsity_type == "unstructured":
        return None
    match = re.fullmatch(r"(\d+):(\d+)", sparsity_type)
    if not match or not 0 < int(match.group(1)) < int(match.group(2)):
        raise ConfigError(f"sparsity_type={sparsity_type!r}: use 'unstructured' or 'N:M' with 0 < N < M")
    return int(match.group(1)), int(match.group(2))


def check_sparsity(sparsity: float, sparsity_type: str) -> None:
    """A ratio in [0, 1); for N:M it must equal N/M."""
    if not 0.0 <= sparsity < 1.0:
        raise ConfigError(f"sparsity={sparsity} is outside [0, 1)")
    nm = parse_sparsity_type(sparsity_type)
    if nm and abs(sparsity - nm[0] / nm[1]) > 1e-9:
        raise ConfigError(f"sparsity_type {sparsity_type} prunes {nm[0]}/{nm[1]} = {nm[0] / nm[1]:g}, "
                          f"but sparsity={sparsity}; set pruning.sparsity={nm[0] / nm[1]:g}")


#: ROW_CHUNK_ENTRIES (from models.memory, whose estimate counts on it): rows of a row-group mask
#: computed at once, so the sort buffers (about 21 bytes a weight) are those of that many weights.


def _lowest_k(scores: torch.Tensor, k: int, ties: str) -> torch.Tensor:
    """Mask of the k lowest entries of a 1-D or row-wise 2-D score tensor along its last dim."""
    mask = torch.zeros_like(scores, dtype=torch.bool)
    if k <= 0 and ties == "exact":
        return mask
    if ties == "exact":
        order = torch.sort(scores, dim=-1, stable=True).indices[..., :k]
        return mask.scatter_(-1, order, True)
    if k >= scores.shape[-1]:  # the reference indexes past the end: an error there, nothing pruned here
        return mask
    # the k-th smallest (0-based), as the reference's sort(...)[k], without the full sort's buffers
    threshold = torch.kthvalue(scores, k + 1, dim=-1, keepdim=True).values  # the reference's quirk
    return scores <= threshold


def _lowest_k_rows(scores: torch.Tensor, k: int, ties: str) -> torch.Tensor:
    """`_lowest_k` of each row of [out, in] scores, a chunk of rows at a time (rows are independent)."""
    rows = max(1, ROW_CHUNK_ENTRIES // max(scores.shape[1], 1))
    if rows >= scores.shape[0]:
        return _lowest_k(scores, k, ties)
    mask = torch.empty_like(scores, dtype=torch.bool)
    for start in range(0, scores.shape[0], rows):
        mask[start : start + rows] = _lowest_k(scores[start : start + rows], k, ties)
    return mask


def unstructured_mask(scores: torch.Tensor, sparsity: float, group: str = "matrix",
                      ties: str = "exact") -> torch.Tensor:
    """Prune the lowest-scored fraction `sparsity` within each comparison group.

    Args:
        scores: [out, in] importance of each weight (higher = keep).
    """
    if group not in GROUPS:
        raise ConfigError(f"group={group!r} is not one of {', '.join(GROUPS)}")
    if ties not in TIES:
        raise ConfigError(f"ties={ties!r} is not one of {', '.join(TIES)}")
    if sparsity <= 0:
        return torch.zeros_like(scores, dtype=torch.bool)
    if group == "row":
        return _lowest_k_rows(scores, int(scores.shape[1] * sparsity), ties)
    if group == "matrix":
        flat = scores.reshape(-1)
        return _lowest_k(flat, int(flat.numel() * sparsity), ties).view_as(scores)
    mask = torch.zeros_like(scores, dtype=torch.bool)
    for start in range(0, scores.shape[1], 128):
        block = scores[:, start : start + 128]  # [out, <=128]
        flat = block.reshape(-1)
        mask[:, start : start + 128] = _lowest_k(flat, int(flat.numel() * sparsity), ties).view_as(block)
    return mask


def nm_mask(scores: torch.Tensor, n: int, m: int) -> torch.Tensor:
    """Prune the n lowest of every m consecutive input weights in each row ([out, in] scores)."""
    out_features, in_features = scores.shape
    if in_features % m:
        raise ValueError(f"in_features {in_features} is not a multiple of m={m}")
    groups = scores.reshape(out_features, in_features // m, m)  # [out, in/m, m]
    lowest = torch.topk(groups, n, dim=-1, largest=False).indices
    mask = torch.zeros_like(groups, dtype=torch.bool).scatter_(-1, lowest, True)
    return mask.view(out_features, in_features)


def make_mask(scores: torch.Tensor, sparsity: float, sparsity_type: str = "unstructured",
              group: str = "matrix", ties: str = "exact") -> torch.Tensor:
    nm = parse_sparsity_type(sparsity_type)
    if nm:
        return nm_mask(scores, *nm)
    return unstructured_mask(scores, sparsity, group, ties)


@torch.no_grad()
def apply_mask(weight: torch.Tensor, mask: torch.Tensor) -> None:
    """Zero the pruned weights in place (`masked_fill_`: boolean indexing would first list the
    pruned positions as int64 pairs, 16 bytes per pruned weight)."""
    weight.masked_fill_(mask.to(weight.device), 0)
