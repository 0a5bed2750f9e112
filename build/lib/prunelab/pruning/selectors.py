"""Which decoder layers to remove, given a scorer's output: pure functions, no model.

- `lowest`: the n layers of lowest score (ShortGPT, Shortened LLaMA, random).
- `contiguous`: the block of n consecutive layers of lowest score (Gromov et al. angular distance,
  LLM-Streamline); from per-block scores when the scorer gives them, else the sum of per-layer ones.
- `iterative`: the scorer's own removal order (SLEB, which selects while scoring).
- `nonadjacent`: ascending per-layer score, never two adjacent layers (the swap-KL probes' rule).
- `cluster`: agglomerative grouping of ADJACENT layers by average-linkage similarity (WRP); each
  group keeps its protected layers, or else its first layer, and the rest are removed. Groups are
  contiguous because a layer can only stand in for its neighbours at its own depth.

Protect rules: the first k, the last k, and Shortened LLaMA's "+" rule (blocks 0-3 and the last two).
Ties break toward the lower layer index, so the same scores always give the same selection.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from prunelab.errors import ConfigError
from prunelab.pruning.scorers.base import LayerScores

SELECTORS = ("auto", "lowest", "nonadjacent", "contiguous", "iterative", "cluster")


def protected_layers(num_layers: int, first: int = 0, last: int = 0,
                     plus_rule: bool = False) -> frozenset[int]:
    """Indices no selector may remove."""
    keep = set(range(min(first, num_layers))) | set(range(max(num_layers - last, 0), num_layers))
    if plus_rule:
        keep |= set(range(min(4, num_layers))) | set(range(max(num_layers - 2, 0), num_layers))
    return frozenset(keep)


def check_removable(num_layers: int, num_remove: int, protected: frozenset[int]) -> None:
    if num_remove >= num_layers:
        raise ConfigError(f"pruning.num_layers={num_remove} would remove all {num_layers} decoder layers; "
                          f"at most {num_layers - 1} can be removed")
    free = num_layers - len(protected)
    if num_remove > free:
        raise ConfigError(f"protect rules keep {len(protected)} of {num_layers} layers, leaving {free} "
                          f"removable; pruning.num_layers={num_remove} is too many")


def select_lowest(scores: Sequence[float | None], num_remove: int, protected: frozenset[int]) -> list[int]:
    candidates = [i for i, s in enumerate(scores) if i not in protected and s is not None]
    if len(candidates) < num_remove:
        raise ConfigError(f"only {len(candidates)} layers can be removed, {num_remove} requested")
    return sorted(sorted(candidates, key=lambda i: (scores[i], i))[:num_remove])


def select_nonadjacent(scores: Sequence[float | None], num_remove: int,
                       protected: frozenset[int]) -> list[int]:
    """Greedy by ascending score, skipping any layer next to one already chosen."""
    chosen: list[int] = []
    candidates = [i for i, s in enumerate(scores) if i not in protected and s is not None]
    for index in sorted(candidates, key=lambda i: (scores[i], i)):
        if len(chosen) == num_remove:
            break
        if all(abs(index - c) > 1 for c in chosen):
            chosen.append(index)
    if len(chosen) < num_remove:
        raise ConfigError(f"only {len(chosen)} non-adjacent layers can be removed, {num_remove} requested; "
                          "use selector=lowest (the clustered variant) or fewer layers")
    return sorted(chosen)


def valid_starts(num_layers: int, num_remove: int, protected: frozenset[int]) -> list[int]:
    """Starts j of the blocks [j, j + n) that lie inside the model and avoid protected layers."""
    return [j for j in range(num_layers - num_remove + 1)
            if not any(i in protected for i in range(j, j + num_remove))]


def select_contiguous(scores: LayerScores, num_remove: int, num_layers: int,
                      protected: frozenset[int]) -> list[int]:
    if num_remove == 0:
        return []
    starts = valid_starts(num_layers, num_remove, protected)
    if scores.block_starts is not None:
        block = scores.block_starts
    elif scores.per_layer is not None:
        block = [sum(scores.per_layer[j:j + num_remove]) if j + num_remove <= num_layers else None
                 for j in range(num_layers)]
    else:
        raise ConfigError("the contiguous selector needs per-layer or per-block scores")
    starts = [j for j in starts if j < len(block) and block[j] is not None]
    if not starts:
        raise ConfigError(f"no block of {num_remove} consecutive unprotected layers exists; "
                          "lower pruning.num_layers or the protect settings")
    best = min(starts, key=lambda j: (block[j], j))
    return list(range(best, best + num_remove))


def select_iterative(order: Sequence[int], num_remove: int) -> list[int]:
    if len(order) < num_remove:
        raise ConfigError(f"the scorer's removal order has {len(order)} layers, {num_remove} requested")
    return sorted(order[:num_remove])


def cluster_adjacent(similarity: Sequence[Sequence[float]], num_remove: int,
                     protected: frozenset[int]) -> tuple[list[int], list[list[int]]]:
    """Merge adjacent groups of highest average similarity until num_remove layers are redundant.

    Two groups that both hold protected layers never merge, so every merge frees exactly one layer.
    Returns (removed layers, groups).
    """
    groups = [[i] for i in range(len(similarity))]

    def linkage(a: list[int], b: list[int]) -> float:
        return sum(similarity[i][j] for i in a for j in b) / (len(a) * len(b))

    for _ in range(num_remove):
        candidates = [k for k in range(len(groups) - 1)
                      if not (protected & set(groups[k]) and protected & set(groups[k + 1]))]
        if not candidates:
            raise ConfigError(f"cluster selection cannot free {num_remove} layers under the protect rules")
        k = max(candidates, key=lambda k: (linkage(groups[k], groups[k + 1]), -k))
        groups[k:k + 2] = [groups[k] + groups[k + 1]]
    removed = []
    for group in groups:
        keep = [i for i in group if i in protected] or group[:1]
        removed.extend(i for i in group if i not in keep)
    return sorted(removed), groups


def select(scores: LayerScores, selector: str, num_remove: int, num_layers: int,
           protected: frozenset[int]) -> tuple[list[int], dict[str, Any]]:
    """Dispatch to one selector; returns (removed layers, details for the record)."""
    check_removable(num_layers, num_remove, protected)
    if selector == "lowest":
        if scores.per_layer is None:
            raise ConfigError("the lowest selector needs per-layer scores")
        return select_lowest(scores.per_layer, num_remove, protected), {}
    if selector == "nonadjacent":
        if scores.per_layer is None:
            raise ConfigError("the nonadjacent selector needs per-layer scores")
        return select_nonadjacent(scores.per_layer, num_remove, protected), {}
    if selector == "contiguous":
        return select_contiguous(scores, num_remove, num_layers, protected), {}
    if selector == "iterative":
        if scores.order is None:
            raise ConfigError("the iterative selector needs a scorer that gives a removal order (sleb)")
        return select_iterative(scores.order, num_remove), {}
    if selector == "cluster":
        if scores.pairwise is None:
            raise ConfigError("the cluster selector needs an all-pairs similarity matrix (wrp)")
        removed, groups = cluster_adjacent(scores.pairwise, num_remove, protected)
        return removed, {"groups": groups}
    raise ConfigError(f"pruning.selector must be one of {SELECTORS}, not {selector!r}")
