"""Shared arithmetic of the non-uniform allocation policies: mean constraints and bounded bands.

Every non-uniform policy names its mean constraint explicitly (`mean` in its YAML):
- plain: the plain mean of the per-layer sparsities is the target;
- params: the mean weighted by each layer's prunable parameters is the target, which is what the
  measured overall sparsity (zeros / weights over all pruned linears) equals.
In the supported decoder-only models every layer has the same linears, so the two coincide; they
differ when layers differ in size (or per-matrix allocations).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch

from prunelab.errors import ConfigError

log = logging.getLogger(__name__)

MEANS = ("plain", "params")


def check_mean(mean: str, policy: str) -> None:
    if mean not in MEANS:
        raise ConfigError(f"pruning.allocation.mean={mean!r} ({policy}) is not one of {', '.join(MEANS)}")


def check_bound(bound: float, policy: str, name: str = "bound") -> None:
    if not 0.0 <= bound < 1.0:
        raise ConfigError(f"pruning.allocation.{name}={bound} ({policy}) must be in [0, 1)")


def check_band(target: float, low: float, high: float, policy: str) -> None:
    """Fail early when the policy's band around the target leaves [0, 1)."""
    if low < 0.0 or high >= 1.0:
        raise ConfigError(f"{policy} allocation around sparsity {target:g} spans [{low:g}, {high:g}], "
                          "outside [0, 1): lower the bound or the sparsity")


def mean_weights(layer_params: Sequence[int], mean: str) -> torch.Tensor:
    """[layers] weights summing to 1 that define the policy's mean; layer_params: [layers] prunable
    weights of each layer (`DenseStatistics.layer_params`)."""
    counts = torch.tensor(list(layer_params), dtype=torch.float64)  # [L]
    if mean == "plain":
        counts = torch.ones_like(counts)
    return counts / counts.sum()  # [L]


def weighted_mean(values: Sequence[float], weights: torch.Tensor) -> float:
    return float((torch.as_tensor(values, dtype=torch.float64) * weights).sum())


def centred_band(values: Sequence[float], target: float, bound: float, weights: torch.Tensor,
                 higher_means_denser: bool = True) -> list[float]:
    """Map a per-layer statistic affinely into [target - bound, target + bound] with mean = target.

    s_l = target -/+ bound * (v_l - mean_w(v)) / max_l |v_l - mean_w(v)|: the mean under `weights` is
    the target exactly, the layer farthest from the mean sits on the bound, order and relative
    spacing of the statistic are kept. Equal (or non-finite spread of) values: target everywhere.

    Args:
        values: [layers] the policy's statistic (percentile, gradient, random draw).
        weights: [layers] mean weights summing to 1 (`mean_weights`).
        higher_means_denser: a higher statistic gets a lower sparsity.
    """
    v = torch.as_tensor(values, dtype=torch.float64)  # [L]
    w = weights.double() / weights.double().sum()  # [L]
    centred = v - (v * w).sum()  # [L]
    spread = centred.abs().max()
    if not torch.isfinite(spread) or spread <= 1e-12 * float(v.abs().max()):  # equal up to rounding
        return [float(target)] * v.numel()
    sign = -1.0 if higher_means_denser else 1.0
    return (target + sign * bound * centred / spread).tolist()


def check_targets(targets: Sequence[float], target: float, weights: torch.Tensor, policy: str) -> list[float]:
    """Targets in [0, 1), mean on target (within float error): else a clear error."""
    bad = [t for t in targets if not 0.0 <= t < 1.0]
    if bad:
        raise ConfigError(f"{policy} allocation gives layer sparsities outside [0, 1) ({bad[:3]}) at "
                          f"sparsity {target:g}: lower its bound or the sparsity")
    mean = weighted_mean(targets, weights)
    if abs(mean - target) > 1e-9:
        raise AssertionError(f"{policy}: mean {mean} != target {target}")
    return [float(t) for t in targets]


class Band:
    """[S - bound, S + bound] with an explicit mean constraint: what PALS, gradient and random
    allocation share. A policy computes its per-layer statistic; the band maps it to targets."""

    def __init__(self, policy: str, bound: float, mean: str):
        check_bound(bound, policy)
        check_mean(mean, policy)
        self.policy, self.bound, self.mean = policy, bound, mean

    def validate(self, target: float) -> None:
        check_band(target, target - self.bound, target + self.bound, self.policy)

    def targets(self, values: Sequence[float], target: float, layer_params: Sequence[int],
                higher_means_denser: bool = True) -> list[float]:
        weights = mean_weights(layer_params, self.mean)
        return check_targets(centred_band(values, target, self.bound, weights, higher_means_denser),
                             target, weights, self.policy)

    def details(self) -> dict:
        return {"bound": self.bound, "mean": self.mean}
