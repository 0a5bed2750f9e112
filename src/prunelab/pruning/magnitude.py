"""Magnitude pruning: remove the weights of smallest |W|. Data-free baseline.

Han et al., "Learning both Weights and Connections for Efficient Neural Networks", 2015; as run in
the Wanda repository (`--prune_method magnitude`). Score |W_ij|; one threshold per weight matrix
(`group: matrix`, the reference default); N:M prunes the n smallest of every m consecutive inputs.
Quirk: the reference prunes every score <= the k-th smallest (k + 1 entries, plus ties); the faithful
default prunes exactly k, `ties: reference` reproduces the quirk. Select with `pruning=magnitude`.
"""

from __future__ import annotations

from typing import Any

import torch

from prunelab.allocation.uniform import Uniform
from prunelab.allocation.base import Allocation
from prunelab.errors import ConfigError
from prunelab.pruning.base import PruneContext, PruneReport
from prunelab.pruning.masks import GROUPS, TIES, apply_mask, check_sparsity, make_mask, parse_sparsity_type
from prunelab.scoring.weights import magnitude_scores


class Magnitude:
    name = "magnitude"

    def __init__(self, sparsity: float = 0.5, sparsity_type: str = "unstructured", group: str = "matrix",
                 ties: str = "exact", allocation: Allocation | None = None):
        check_sparsity(sparsity, sparsity_type)
        if group not in GROUPS or ties not in TIES:
            raise ConfigError(f"pruning.group must be one of {GROUPS} and pruning.ties one of {TIES}")
        self.sparsity = sparsity
        self.sparsity_type = sparsity_type
        self.group = group
        self.ties = ties
        self.allocation = allocation or Uniform()
        if parse_sparsity_type(sparsity_type) and self.allocation.name != "uniform":
            raise ConfigError("N:M sparsity fixes every layer at N/M: use pruning/allocation=uniform")

    def labels(self) -> dict[str, Any]:
        return {"method": self.name, "sparsity": self.sparsity, "sparsity_type": self.sparsity_type,
                "allocation": self.allocation.name}

    def score(self, ctx: PruneContext) -> list[float]:
        """Magnitude needs no scores beyond |W|, computed per matrix while pruning; the allocation is
        this method's scoring stage."""
        return self.allocation.allocate(self.sparsity, ctx)

    @torch.no_grad()
    def prune(self, ctx: PruneContext, layer_targets: list[float]) -> PruneReport:
        adapter = ctx.loaded.adapter
        for index, layer in enumerate(adapter.layers):
            for linear in adapter.linears(layer).values():
                mask = make_mask(magnitude_scores(linear.weight), layer_targets[index],
                                 self.sparsity_type, self.group, self.ties)
                apply_mask(linear.weight, mask)
        return PruneReport(layer_targets=list(layer_targets))
