"""WRP: all-pairs layer similarity from the weights that write into the residual stream.

Seed method (no public code). For every pair of layers (i, j) and each residual writer p (attention
output projection, MLP output projection):

    S_p(i, j) = sim(W_p^i, W_p^j) * min(||W_p^i||, ||W_p^j||) / max(||W_p^i||, ||W_p^j||)
    S(i, j)   = mean over p of S_p(i, j)

`sim` is either the permutation-invariant Gram form (linear CKA on the output space: compare the
residual-side Gram matrices W W^T, centred over the residual dimensions; invariant to any reordering
of heads or FFN neurons, which is arbitrary across layers) or the literal raw-weight cosine
cos(vec W^i, vec W^j). Forward-free. Weights are [C, n] (nn.Linear layout: residual rows).
Memory: the Gram form keeps one normalised C x C Gram per layer (L * C^2 floats per writer), the
raw form every writer's weights. The rows are computed one layer at a time (`writer_row`), so a
streamed model reads each layer once and keeps only the rows (on disk beyond the budget).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

FORMS = ("gram", "raw")


def frobenius_norms(weights: Sequence[torch.Tensor]) -> torch.Tensor:
    """[L] Frobenius norm of each layer's matrix."""
    return torch.stack([w.detach().float().norm() for w in weights])  # [L]


def relative_scale(norms: torch.Tensor) -> torch.Tensor:
    """min/max ratio of every pair of norms. norms: [L] -> [L, L], 1 on the diagonal."""
    a, b = norms[:, None], norms[None, :]  # [L, 1], [1, L]
    high = torch.maximum(a, b)
    ratio = torch.minimum(a, b) / high.clamp_min(1e-30)  # [L, L]
    return torch.where(high > 0, ratio, torch.ones_like(high))  # [L, L]


def _cosine_rows(rows: torch.Tensor) -> torch.Tensor:
    """rows: [L, D] -> [L, L] cosine between rows (a zero row has similarity 0 with others)."""
    unit = rows / rows.norm(dim=1, keepdim=True).clamp_min(1e-30)  # [L, D]
    return (unit @ unit.T).clamp(-1.0, 1.0)  # [L, L]


def gram_row(weight: torch.Tensor, center: bool = True) -> torch.Tensor:
    """One layer's row of the Gram form: its residual-side Gram G = W_c W_c^T [C, C], with W_c
    centred over the C residual dimensions (the CKA "samples"), normalised, flattened to [C*C]."""
    w = weight.detach().float()  # [C, n]
    if center:
        w = w - w.mean(dim=0, keepdim=True)  # [C, n]
    gram = w @ w.T  # [C, C]
    return (gram / gram.norm().clamp_min(1e-30)).reshape(-1)  # [C*C]


def writer_row(weight: torch.Tensor, form: str = "gram") -> torch.Tensor:
    """What the all-pairs similarity compares of one layer's writer: its Gram row, or (raw) the
    flattened weight."""
    return gram_row(weight) if form == "gram" else weight.detach().float().reshape(-1)


def similarity_of_rows(rows: torch.Tensor, form: str = "gram") -> torch.Tensor:
    """[L, D] writer rows -> [L, L]: linear CKA of the Gram rows (unit already) or raw cosine."""
    return (rows @ rows.T).clamp(-1.0, 1.0) if form == "gram" else _cosine_rows(rows)


def raw_cosine(weights: Sequence[torch.Tensor]) -> torch.Tensor:
    """Literal similarity: cosine between flattened weights. Each [C, n] (same shape) -> [L, L]."""
    return similarity_of_rows(torch.stack([writer_row(w, "raw") for w in weights]), "raw")  # [L, L]


def gram_cka(weights: Sequence[torch.Tensor], center: bool = True) -> torch.Tensor:
    """Linear CKA between the layers' residual-side Grams: <G_i, G_j>_F / (||G_i|| ||G_j||).

    weights: each [C, n_l] (n_l may differ). Invariant to permuting (or rotating) the n_l columns.
    Returns [L, L].
    """
    return similarity_of_rows(torch.stack([gram_row(w, center) for w in weights]), "gram")  # [L, L]


def writer_similarity(weights: Sequence[torch.Tensor], form: str = "gram") -> dict[str, torch.Tensor]:
    """For one residual writer over all layers: similarity, relative scale and their product."""
    if form not in FORMS:
        raise ValueError(f"form must be one of {FORMS}, not {form!r}")
    rows = torch.stack([writer_row(w, form) for w in weights])  # [L, D]
    return similarity_parts(rows, frobenius_norms(weights), form)


def similarity_parts(rows: torch.Tensor, norms: torch.Tensor, form: str = "gram") -> dict[str, torch.Tensor]:
    """rows [L, D] (`writer_row` of each layer) and norms [L] -> similarity, scale, product."""
    sim = similarity_of_rows(rows, form)  # [L, L]
    scale = relative_scale(norms)  # [L, L]
    return {"similarity": sim, "scale": scale, "combined": sim * scale}  # each [L, L]


def combine_writers(attn: dict[str, torch.Tensor], mlp: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The WRP matrix S [L, L] (higher = more redundant) from both writers' parts."""
    return {"similarity": (attn["combined"] + mlp["combined"]) / 2,  # [L, L]
            "attn_out": attn["combined"], "mlp_out": mlp["combined"],
            "attn_out_scale": attn["scale"], "mlp_out_scale": mlp["scale"]}


def wrp_matrix(attn_out: Sequence[torch.Tensor], mlp_out: Sequence[torch.Tensor],
               form: str = "gram") -> dict[str, torch.Tensor]:
    """All-pairs WRP similarity S [L, L] (higher = more redundant) and its parts per writer."""
    return combine_writers(writer_similarity(attn_out, form), writer_similarity(mlp_out, form))


def redundancy_scores(similarity: torch.Tensor) -> torch.Tensor:
    """Per-layer importance for a "lowest" selection: 1 - max similarity to any other layer. [L]."""
    off = similarity.clone()
    off.fill_diagonal_(float("-inf"))
    return 1.0 - off.max(dim=1).values  # [L]
