"""A parameter budget shared by width and depth pruning: the fraction of the model's parameters
removed.

The fraction is of every parameter of the model as `pruning.report.parameter_counts` counts them
(embeddings, head and norms included, tied weights once), so that a width method and a depth
method run at the same `params_removed` end with the same parameter count. What a method adds
back (FLAP's compensation biases) counts against the budget. Pure arithmetic, no model.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from prunelab.errors import ConfigError

TOLERANCE = 0.01  # the achieved fraction is within this of the target (absolute) or a warning is logged


def check_fraction(target: float | None, key: str = "pruning.params_removed") -> None:
    """A fraction removed must be in (0, 1): one line otherwise."""
    if target is None:
        return
    if isinstance(target, bool) or not isinstance(target, (int, float)) or not 0 < target < 1:
        raise ConfigError(f"{key} is the fraction of parameters removed and must be in (0, 1), not {target!r}")


def parameters_to_remove(total: int, target: float, added: int = 0) -> float:
    """Parameters the removed units must hold so that `target` x `total` go net of `added` ones."""
    return target * total + added


def removed_fraction(dense_total: int, pruned_total: int) -> float:
    """The achieved fraction: 1 - pruned / dense."""
    return 1.0 - pruned_total / dense_total


def nearest_count(unit_cost: float, need: float, limit: int) -> int:
    """How many units of `unit_cost` parameters come nearest to removing `need` (0..limit)."""
    if unit_cost <= 0:
        return 0
    return int(min(max(round(need / unit_cost), 0), limit))


def layers_for_fraction(layer_parameters: Sequence[int], total: int, target: float) -> int:
    """Depth pruning's number of layers at a parameter budget: the count whose removal comes nearest
    to `target` x `total`, taking the layers' mean size (decoder layers are alike)."""
    check_fraction(target)
    mean = sum(layer_parameters) / max(len(layer_parameters), 1)
    return nearest_count(mean, parameters_to_remove(total, target), len(layer_parameters))


def uniform_counts(total: int, target: float, num_layers: int, unit_costs: tuple[int, int],
                   units: tuple[int, int], added: int = 0) -> tuple[int, int]:
    """(attention units, MLP channels) removed from every layer to remove `target` x `total`
    parameters with the same structure in each layer: attention units at the fraction of the
    decoder layers' parameters that must go (floored, as the references' per-layer ratio), then MLP
    channels for the rest (rounded to the nearest).

    unit_costs: parameters of one (attention unit, MLP channel); units: their numbers per layer.
    A budget the MLP cannot cover without removing every channel is one line.
    """
    need = parameters_to_remove(total, target, added)
    layer_total = num_layers * (unit_costs[0] * units[0] + unit_costs[1] * units[1])
    heads = min(math.floor(need / layer_total * units[0]), units[0] - 1)
    rest = need - num_layers * heads * unit_costs[0]
    channels = nearest_count(num_layers * unit_costs[1], rest, units[1])
    if channels >= units[1]:
        raise ConfigError(f"pruning.params_removed={target} would remove every MLP channel of every layer: "
                          "use a smaller target")
    return heads, channels


def dimension_for_fraction(change_of: Callable[[int], int], total: int, target: float, hidden: int,
                           round_interval: int) -> int:
    """SliceGPT's kept dimension at a parameter budget: the multiple of `round_interval` below
    `hidden` whose slicing comes nearest to removing `target` x `total` parameters.

    change_of(d): parameters the slicing adds (positive) or removes (negative) at kept dimension d;
    not linear in d (the shortcut matrices grow as d^2, untying a head adds a constant), so every
    candidate is counted. A budget beyond what any candidate removes is one line; one between two
    candidates further apart than 2 x TOLERANCE (a small model) gets the nearest, and the record's
    achieved fraction says how near.
    """
    check_fraction(target)
    candidates = range(round_interval, hidden, round_interval)
    if not candidates:
        raise ConfigError(f"SliceGPT has no dimension to keep below the hidden size {hidden} in steps of "
                          f"pruning.round_interval={round_interval}")
    removed = {d: -change_of(d) / total for d in candidates}
    low, high = min(removed.values()), max(removed.values())
    if not low - TOLERANCE <= target <= high + TOLERANCE:
        raise ConfigError(f"SliceGPT cannot remove {target} of this model's parameters (its shortcut matrices "
                          f"and untied head cost parameters): kept dimensions {round_interval}..{candidates[-1]} "
                          f"remove {low:.3f} to {high:.3f}")
    return min(candidates, key=lambda d: (abs(removed[d] - target), -d))
