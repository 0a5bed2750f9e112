"""ALPS: layer-wise pruning by ADMM with a conjugate-gradient polish, strongest at high sparsity.

Meng, Behdin, Wang & Mazumder, "ALPS: Improved Optimization for Highly Sparse One-Shot Pruning for
Large Language Models", NeurIPS 2024 (mazumder-lab/ALPS). Layer by layer (the pruned layer's
outputs feed the next):
1. one forward of the still-dense layer gives every linear its Gram matrix X^T X (a float32 sum
   over the calibration tokens), so o_proj and down_proj see the dense layer's inputs;
2. each linear is solved on its own (`pruning.alps_solver.alps_solve`): ADMM on
   ||X W^T - X B||^2 under a support constraint on the whole matrix (one top-k keeping
   round((1 - s) x numel) weights; rows end up with very different counts) or N:M over 4
   consecutive inputs of a row, then 10 CG iterations on the final support;
3. the layer is run again with all its linears pruned for the next layer's inputs.
Select with `pruning=alps` (conf/pruning/alps.yaml); layer targets from `pruning/allocation`.

The defaults are the official code's (`llama.py` + `alps.py` as its README runs them): rho 0.1,
the penalty schedule, the stopping rule, CG without preconditioner, damping 1% of the mean
diagonal. Each linear's ADMM iterations, final rho, relative reconstruction error (before and after
CG) and seconds go to the record (`pruning.alps`), with the layer's totals: ALPS costs far more per
layer than Wanda or SparseGPT, and the record says how much.

Measured against the official code (its `llama_sequential`, unedited, CPU shims; 32 x 256 realtext
tokens, seed 0) on the first 4 layers of SmolLM2-135M: the defaults give its masks and weights bit
for bit at `sparsity: 0.7` (its `sp=0.7`) and at `sparsity_type: 2:4` (its `--nm_n 2 --nm_m 4`), 0 of
14,155,776 entries differing (results/benchmarks/official_alps.md); over all 30 layers with the
defaults (`sparsity: 0.5`, its `sp=0.5`) and at 2:4, 0 of 106,168,320, weights equal
(results/benchmarks/official_alps_all_layers.md).
"""

from __future__ import annotations

from typing import Any

import torch

from prunelab.allocation.base import Allocation, allocation_details
from prunelab.allocation.uniform import Uniform
from prunelab.calibration.dense_statistics import DenseStatistics
from prunelab.calibration.passes import layer_pass, role_linears, role_readers
from prunelab.calibration.statistics import GramSum, collect_linear_inputs
from prunelab.context import PruneContext, PruneReport
from prunelab.errors import ConfigError
from prunelab.pruning.alps_solver import AdmmSettings, alps_solve
from prunelab.pruning.budget import PROPAGATE
from prunelab.pruning.masks import check_sparsity, parse_sparsity_type


class ALPS:
    name = "alps"

    def __init__(self, sparsity: float = 0.5, sparsity_type: str = "unstructured", rho: float = 0.1,
                 max_iter: int = 300, update_iter: int = 3, switch_iter: int = 30, cg_iter: int = 10,
                 cg_rtol: float = 1e-4, percdamp: float = 0.01, propagate: str = "pruned",
                 allocation: Allocation | None = None, refine: Any = None):
        if refine is not None:
            raise ConfigError("pruning/refine cannot refine ALPS: its weights are re-fitted to the support it "
                              "chooses (use pruning/refine=null)")
        self.allocation = allocation or Uniform()
        self.nm = parse_sparsity_type(sparsity_type)
        check_sparsity(sparsity, sparsity_type)
        if propagate not in PROPAGATE:
            raise ConfigError(f"pruning.propagate={propagate!r} is not one of {', '.join(PROPAGATE)}")
        if self.nm is not None and self.allocation.name != "uniform":
            raise ConfigError(f"pruning.sparsity_type={sparsity_type} fixes every layer's sparsity: "
                              "use pruning/allocation=uniform")
        self.settings = AdmmSettings(rho, max_iter, update_iter, switch_iter, cg_iter, cg_rtol, percdamp)
        self.settings.check()
        self.sparsity, self.sparsity_type, self.propagate = sparsity, sparsity_type, propagate

    def labels(self) -> dict[str, Any]:
        return {"method": self.name, "sparsity": self.sparsity, "sparsity_type": self.sparsity_type,
                "allocation": self.allocation.name}

    def allocate(self, ctx: PruneContext) -> list[float]:
        """Per-layer targets from the allocation policy; ALPS itself solves layer by layer in `prune`."""
        return self.allocation.allocate(self.sparsity, DenseStatistics(ctx))

    @staticmethod
    def layer_state_bytes(out_features: int, in_features: int) -> int:
        """Peak state of one linear's solve: the Gram matrix, its scaled copy and the float32
        inverse (3 x 4 bytes per [in, in] entry), its float64 eigenvectors and one float64 product
        (2 x 8), and per weight B, D, V, the target and the CG's vectors (about 10 float32 [in, out])."""
        return (3 * 4 + 2 * 8) * in_features * in_features + 10 * 4 * out_features * in_features

    @torch.no_grad()
    def prune(self, ctx: PruneContext, layer_targets: list[float]) -> PruneReport:
        adapter = ctx.loaded.adapter
        steps = layer_pass(adapter, ctx.calibration(), ctx.batch_size, self.propagate, ctx.progress, desc="alps")
        solves: dict[str, dict[str, Any]] = {}
        for step in steps:
            groups = role_linears(adapter, step.layer)
            with collect_linear_inputs(role_readers(groups), GramSum) as grams:  # the dense layer's inputs
                step.forward()
            for role, group in groups.items():
                gram = grams.pop(role).value  # [in, in], shared by the role's linears (q, k, v read one input)
                for name, linear in group.items():
                    solve = alps_solve(linear.weight, gram, layer_targets[step.index], self.nm, self.settings)
                    linear.weight.copy_(solve.weight.to(linear.weight.dtype))  # [out, in]
                    solves[f"layers.{step.index}.{name}"] = {
                        "iterations": solve.iterations, "final_rho": solve.final_rho,
                        "error_admm": solve.error_admm, "error": solve.error,
                        "admm_seconds": solve.admm_seconds, "cg_seconds": solve.cg_seconds}
                del gram
        details = {"allocation": allocation_details(self.allocation, layer_targets),
                   "alps": {"settings": vars(self.settings), "linears": solves, **_totals(solves)}}
        return PruneReport(layer_targets=list(layer_targets), details=details)


def _totals(solves: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The run's ALPS cost: seconds in ADMM and in CG, and the iterations' spread."""
    iterations = [solve["iterations"] for solve in solves.values()] or [0]
    return {"admm_seconds": sum(solve["admm_seconds"] for solve in solves.values()),
            "cg_seconds": sum(solve["cg_seconds"] for solve in solves.values()),
            "iterations_min": min(iterations), "iterations_max": max(iterations),
            "iterations_mean": sum(iterations) / len(iterations)}
