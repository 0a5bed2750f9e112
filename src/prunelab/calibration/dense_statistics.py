"""What allocation policies read about the dense model, computed on demand and cached.

A policy gets a `DenseStatistics` and never walks the model itself: per-layer prunable parameter
counts and linear weights come from the adapter, and the calibration passes (squared input norms
for OWL, |activation| histograms for PALS, squared LM-loss gradients for gradient allocation) run
here, through `calibration.passes` and `calibration.gradients`, cached on disk per model and
calibration data (`calibration.cache`) so a sweep over ratios and policies measures them once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import torch

from prunelab.calibration.cache import cached
from prunelab.calibration.gradients import squared_weight_gradients
from prunelab.calibration.passes import dense_role_statistics
from prunelab.calibration.statistics import AbsHistogram, SquaredColumnNorm
from prunelab.context import PruneContext
from prunelab.models.adapter import ROLES


class DenseStatistics:
    """Statistics of the dense model of one run (`ctx`), per decoder layer."""

    def __init__(self, ctx: PruneContext):
        self.ctx = ctx
        self.adapter = ctx.loaded.adapter

    @property
    def num_layers(self) -> int:
        return self.adapter.num_layers

    @property
    def seed(self) -> int:
        return self.ctx.seed

    def calibration_sequences(self) -> int:
        return self.ctx.calibration().shape[0]

    def linear_weights(self) -> Iterator[list[torch.Tensor]]:
        """Per layer, in order, the weights ([out, in]) of its linears in forward order; each
        layer in memory while it is used (a streamed model's is read then, and released after)."""
        adapter = self.adapter
        for _, layer in adapter.layers_in_memory():
            yield adapter.linear_weights(layer)

    def role_weights(self) -> Iterator[dict[str, list[torch.Tensor]]]:
        """Per layer, in order, role -> the weights of the linears reading that role's input."""
        adapter = self.adapter
        for _, layer in adapter.layers_in_memory():
            yield {role: [lin.weight for lin in adapter.linears(layer, (role,)).values()] for role in ROLES}

    def layer_params(self) -> list[int]:
        """Prunable weights of each decoder layer (its linears), from their shapes alone."""
        adapter = self.adapter
        return [sum(lin.weight.numel() for lin in adapter.linears(layer).values()) for layer in adapter.layers]

    def cached(self, statistic: str, params: dict[str, Any], compute: Callable[[], Any],
               uses_calibration: bool = True) -> Any:
        """compute() once per model, calibration data (if used), statistic and params."""
        return cached(self.ctx, statistic, params, compute, uses_calibration)

    def squared_input_norms(self, arithmetic: str = "reference") -> list[dict[str, torch.Tensor]]:
        """Per layer, role -> [in] Wanda's squared input norms ||X_j||^2 over the calibration, in
        the Wanda repository's arithmetic unless told otherwise (`SquaredColumnNorm`)."""
        def compute():
            make = partial(SquaredColumnNorm, arithmetic=arithmetic)
            stats = self._role_pass(make, "dense pass: squared input norms")
            return [{role: s.value.cpu() for role, s in layer.items()} for layer in stats]
        return self.cached("squared_column_norm", {"arithmetic": arithmetic}, compute)

    def abs_histograms(self, bins: int, low: float, high: float) -> torch.Tensor:
        """[layers, bins + 2] counts of |activation| entering each layer's linears (all roles)."""
        def compute():
            make = partial(AbsHistogram, bins=bins, low=low, high=high)
            stats = self._role_pass(make, "dense pass: activation histograms")
            return torch.stack([sum(s.counts for s in layer.values()) for layer in stats])  # [L, bins+2]
        params = {"bins": bins, "low": low, "high": high}
        return self.cached("abs_activation_histogram", params, compute)

    def squared_gradients(self) -> torch.Tensor:
        """[layers] sum over calibration sequences of the squared LM-loss gradients of each layer's
        linear weights (one sequence per backward pass; a float16 model's loss-scaled, so that
        small gradients do not flush to zero: `calibration.gradients`)."""
        def compute():
            return squared_weight_gradients(self.adapter, self.ctx.calibration(), self.ctx.progress)
        params = {"loss": "next_token_ce", "per": "sequence"}
        if next(self.adapter.model.parameters()).dtype == torch.float16:  # earlier values flushed to zero
            params["loss_scale"] = "dynamic"
        return self.cached("linear_weight_gradient_sq", params, compute)

    def _role_pass(self, make_statistic: Callable, desc: str) -> list[dict]:
        return dense_role_statistics(self.adapter, self.ctx.calibration(), make_statistic,
                                     self.ctx.batch_size, self.ctx.progress, desc)
