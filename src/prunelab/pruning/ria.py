"""RIA: relative importance and activation pruning, with channel permutation for N:M.

Zhang, Bai, Lin, Zhao, Hou & Cannistraci, "Plug-and-Play: An Efficient Post-training Pruning
Method for Large Language Models", ICLR 2024.
1. Layer by layer (calibration outputs of the pruned layer feed the next), collect Wanda's ||X_j||^2.
2. Score S_ij = (|W_ij| / sum_k |W_kj| + |W_ij| / sum_k |W_ik|) * ||X_j||_2 ** a
   (`scoring.weights.ria_scores`): a weight counts relative to both its input and its output.
3. Prune every score <= the k-th smallest of the whole matrix (k = floor(s x entries)), or the n
   lowest of every m inputs; for N:M, optionally after permuting the input channels
   (`permutation: heuristic | lsa`, `pruning.channel_permutation`).
Select with `pruning=ria` (conf/pruning/ria.yaml); layer-wise targets from `pruning/allocation`.

The defaults are the reference (biomedical-cybernetics/Relative-importance-and-activation-pruning,
`prune_ria`, run as its README shows: `--prune_method ria --sparsity_ratio 0.5 --sparsity_type
unstructured`, `--a 0.5`): one threshold per matrix with every score <= it pruned (`group: matrix`,
`ties: reference`), Wanda's norm arithmetic, pruned outputs fed forward. Switches: `group: row
ties: exact` is its `--per_outneuron` (Wanda's comparison group); `permutation: heuristic` its
`--reallocation` (column importance `sum`, its default), `lsa` its `--reallocation --lsa`,
`lsa_fast: true` its `--fast`. Its `--reconstruction` (SparseGPT-style update) and `--gptq` are not
provided. Measured against the official code and an oracle on SmolLM2-135M:
results/benchmarks/faithful_masks.md.
"""

from __future__ import annotations

from typing import Any

import torch

from prunelab.allocation.base import Allocation
from prunelab.errors import ConfigError
from prunelab.pruning.channel_permutation import assignment_order, permuted_nm_mask, reallocation_order
from prunelab.pruning.dsnot import DSnoT
from prunelab.pruning.masks import parse_sparsity_type
from prunelab.pruning.wanda import Wanda
from prunelab.scoring.weights import ria_scores

PERMUTATIONS = ("none", "heuristic", "lsa")
#: the reference's `--fast`: linear sum assignment in this many blocks of channels, by role
FAST_BLOCKS = {"attn_in": 4, "attn_out": 4, "mlp_in": 8, "mlp_out": 16}


class RIA(Wanda):
    """Wanda's layer pass with RIA's score and mask rules (the statistics and the pass are shared)."""

    name = "ria"

    def __init__(self, sparsity: float = 0.5, sparsity_type: str = "unstructured", a: float = 0.5,
                 group: str = "matrix", ties: str = "reference", permutation: str = "none",
                 lsa_fast: bool = False, propagate: str = "pruned", rounding: str = "floor",
                 norm_arithmetic: str = "reference", allocation: Allocation | None = None,
                 refine: DSnoT | None = None):
        super().__init__(sparsity=sparsity, sparsity_type=sparsity_type, group=group, ties=ties,
                         propagate=propagate, rounding=rounding, norm_arithmetic=norm_arithmetic,
                         allocation=allocation, refine=refine)
        if isinstance(a, bool) or not isinstance(a, (int, float)) or a < 0:
            raise ConfigError(f"pruning.a (RIA's activation exponent) must be a number >= 0, not {a!r}")
        if permutation not in PERMUTATIONS:
            raise ConfigError(f"pruning.permutation={permutation!r} is not one of {', '.join(PERMUTATIONS)}")
        self.nm = parse_sparsity_type(sparsity_type)
        if permutation != "none" and not self.nm:
            raise ConfigError(f"pruning.permutation={permutation} reorders channels for N:M sparsity: "
                              "set pruning.sparsity_type=2:4 (or 4:8), or permutation=none")
        if lsa_fast and permutation != "lsa":
            raise ConfigError("pruning.lsa_fast splits the linear sum assignment: set pruning.permutation=lsa")
        self.a, self.permutation, self.lsa_fast = float(a), permutation, lsa_fast

    def labels(self) -> dict[str, Any]:
        labels = {**super().labels(), "method": self.name}
        if self.permutation != "none":
            labels["permutation"] = self.permutation
        return labels

    def scores(self, weight: torch.Tensor, input_sq_norm: torch.Tensor) -> torch.Tensor:
        return ria_scores(weight, input_sq_norm, self.a)  # [out, in]

    def mask(self, scores: torch.Tensor, ratio: float, role: str) -> tuple[torch.Tensor, None]:
        if self.permutation == "none":
            return super().mask(scores, ratio, role)
        n, m = self.nm
        if scores.shape[1] % m:
            raise ConfigError(f"{scores.shape[1]} input channels do not split into groups of {m}")
        order = reallocation_order(scores, m)  # [in]
        if self.permutation == "lsa":
            order = assignment_order(scores, order, n, m, FAST_BLOCKS[role] if self.lsa_fast else 1)
        return permuted_nm_mask(scores, n, m, order), None
