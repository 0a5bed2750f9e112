"""Keep the measured overall sparsity on target when per-layer targets are continuous.

A mask can only prune whole entries: `row` prunes floor(s x in) of every row, `matrix` and each
128-column block floor(s x size). With a non-uniform allocation (0.537, 0.462, ...) on narrow
matrices these floors drift the overall sparsity below the target by up to one row of zeros per
linear. `rounding: carry` visits the linears in pruning order, asks each mask for the count
nearest to what the targets want so far minus what was measured so far, and carries the remainder
to the next linear, so the overall sparsity over all pruned linears ends within one rounding unit of
the last linear (well inside 0.001). `rounding: floor` (the default: what every reference does)
passes each layer's target to the mask unchanged.

At a uniform 0.5 with `ties: exact` both agree bit for bit (every count is exact). `carry` measures
zeros after pruning, so extra zeros (SparseGPT's dead inputs, `ties: reference` pruning k + 1 and
every tie) are compensated too: it departs from the references' masks even at a uniform target.
"""

from __future__ import annotations

import torch

from prunelab.allocation.base import Allocation
from prunelab.errors import ConfigError
from prunelab.pruning.masks import GROUPS, TIES, check_sparsity, parse_sparsity_type

ROUNDING = ("carry", "floor")
PROPAGATE = ("pruned", "dense")


def check_rounding(rounding: str) -> None:
    if rounding not in ROUNDING:
        raise ConfigError(f"pruning.rounding={rounding!r} is not one of {', '.join(ROUNDING)}")


class SparsityBudget:
    """Running account of wanted and measured zeros over the linears pruned so far."""

    def __init__(self, rounding: str = "floor"):
        check_rounding(rounding)
        self.rounding = rounding
        self.wanted = 0.0  # zeros the layer targets ask for, over the linears recorded so far
        self.measured = 0  # zeros found in those linears after pruning

    def ratio(self, target: float, shape: tuple[int, int] | torch.Size, group: str | None) -> float:
        """The sparsity to ask the mask of the next linear ([out, in] = shape) for; group None for
        a rule that takes a continuous target (Wanda's variant searches for it)."""
        if self.rounding == "floor" or target <= 0:
            return target
        out_features, in_features = int(shape[0]), int(shape[1])
        zeros = self.wanted - self.measured + target * out_features * in_features
        if group is None:
            return min(max(zeros / (out_features * in_features), 0.0), 1.0 - 1.0 / in_features)
        if group == "row":  # the mask prunes k of every row: k * out zeros
            k = min(max(round(zeros / out_features), 0), in_features - 1)
            return (k + 0.5) / in_features  # floor((k + 0.5) / in x in) = k
        numel = out_features * in_features
        k = min(max(round(zeros), 0), numel - 1)
        return (k + 0.5) / numel

    def record(self, target: float, weight: torch.Tensor) -> None:
        """After pruning a linear: add what its layer target wanted and what it now holds."""
        self.wanted += target * weight.numel()
        self.measured += weight.numel() - int(torch.count_nonzero(weight))


def check_method_settings(sparsity: float, sparsity_type: str, group: str, ties: str, propagate: str,
                 rounding: str, allocation: Allocation, target: float) -> None:
    """Validation shared by the weight-pruning methods (magnitude, Wanda, SparseGPT)."""
    check_sparsity(sparsity, sparsity_type)
    if group not in GROUPS or ties not in TIES:
        raise ConfigError(f"pruning.group must be one of {GROUPS} and pruning.ties one of {TIES}")
    if propagate not in PROPAGATE:
        raise ConfigError(f"pruning.propagate={propagate!r} is not one of {', '.join(PROPAGATE)}")
    check_rounding(rounding)
    if parse_sparsity_type(sparsity_type) and allocation.name != "uniform":
        raise ConfigError("N:M sparsity fixes every layer at N/M: use pruning/allocation=uniform")
    validate = getattr(allocation, "validate", None)
    if validate is not None:
        validate(target)
