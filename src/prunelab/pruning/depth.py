"""Depth pruning: remove whole decoder layers chosen by a layer scorer and a selector.

The scorers reproduce ShortGPT (Men et al. 2024), angular distance (Gromov et al. 2024),
LLM-Streamline (Chen et al. 2024), SLEB (Song et al. 2024), Shortened LLaMA (Kim et al. 2024),
random selection and WRP (seed method); see `pruning/scorers/`.
  1. score: the scorer rates the dense model's layers (per layer, per block, an order or all pairs).
  2. select: `selector` picks `num_layers` layers to remove, never a protected one.
  3. prune: the layers are deleted (`adapter.remove_layers`: layer_idx renumbered, config fixed), so
     the model saves and reloads with fewer layers; the dense layer list stays in the report.
Select with `pruning=depth` (scorer `block_influence` by default; `pruning/scorer=<name>`).
`selector: auto` uses the scorer's own (ShortGPT: lowest, angular/streamline: contiguous,
SLEB: iterative, WRP: cluster). `plus_rule: null` follows the scorer's reference (on for
Shortened LLaMA's Magnitude+ and Taylor+). `params_removed: 0.2` (instead of `num_layers`) removes
the number of layers nearest to that fraction of the model's parameters, the budget width pruning
takes too (`pruning.parameter_budget`); the record gives the achieved fraction.
"""

from __future__ import annotations

import logging
from typing import Any

from prunelab.context import PruneContext, PruneReport
from prunelab.errors import ConfigError
from prunelab.pruning.parameter_budget import check_fraction, layers_for_fraction, removed_fraction
from prunelab.pruning.report import layer_parameters, parameter_counts
from prunelab.pruning.scorers.base import LayerScorer, LayerScores, ScoreRequest
from prunelab.pruning.selectors import SELECTORS, check_removable, protected_layers, select

log = logging.getLogger(__name__)


class DepthPruning:
    name = "depth"
    changes_shapes = True  # the efficiency evaluator measures it by default (evaluation.efficiency)

    def __init__(self, scorer: LayerScorer, num_layers: int = 2, selector: str = "auto",
                 protect_first: int = 0, protect_last: int = 0, plus_rule: bool | None = None,
                 params_removed: float | None = None):
        check_fraction(params_removed)  # a budget shared with width pruning (pruning.parameter_budget)
        if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 0:
            raise ConfigError(f"pruning.num_layers must be a non-negative integer, not {num_layers!r}")
        if min(protect_first, protect_last) < 0:
            raise ConfigError("pruning.protect_first and pruning.protect_last must be >= 0")
        if selector not in SELECTORS:
            raise ConfigError(f"pruning.selector must be one of {SELECTORS}, not {selector!r}")
        resolved = scorer.selectors[0] if selector == "auto" else selector
        if resolved not in scorer.selectors:
            raise ConfigError(f"scorer {scorer.name} supports selector {' or '.join(scorer.selectors)}, "
                              f"not {selector!r}")
        self.scorer = scorer
        self.num_layers = num_layers
        self.selector = resolved
        self.protect_first = protect_first
        self.protect_last = protect_last
        self.plus_rule = scorer.plus_rule if plus_rule is None else bool(plus_rule)
        self.params_removed = params_removed  # when set, num_layers follows from it on the model

    def labels(self) -> dict[str, Any]:
        labels = {"method": self.name, "scorer": self.scorer.name, "selector": self.selector,
                  "layers_removed": None if self.params_removed else self.num_layers}
        return {**labels, "params_removed": self.params_removed} if self.params_removed else labels

    def budget_layers(self, adapter) -> None:
        """With `params_removed`, the number of layers whose removal comes nearest to that fraction
        of the model's parameters (embeddings and head included, as width pruning counts them)."""
        if self.params_removed is None or getattr(self, "_budgeted", False):
            return
        self.num_layers = layers_for_fraction(layer_parameters(adapter), parameter_counts(adapter)["total"],
                                              self.params_removed)
        self._budgeted = True
        log.info("pruning.params_removed=%s: %d of %d layers", self.params_removed, self.num_layers,
                 adapter.num_layers)

    def request(self, num_layers: int) -> ScoreRequest:
        protected = protected_layers(num_layers, self.protect_first, self.protect_last, self.plus_rule)
        check_removable(num_layers, self.num_layers, protected)
        return ScoreRequest(num_layers=num_layers, num_remove=self.num_layers, protected=protected)

    def score(self, ctx: PruneContext) -> LayerScores:
        self.budget_layers(ctx.loaded.adapter)
        request = self.request(ctx.loaded.adapter.num_layers)  # bad settings fail before any forward
        return self.scorer.score(ctx, request)

    def prune(self, ctx: PruneContext, scores: LayerScores) -> PruneReport:
        adapter = ctx.loaded.adapter
        self.budget_layers(adapter)
        dense_total = parameter_counts(adapter)["total"]
        dense_layers = list(adapter.layers)
        request = self.request(len(dense_layers))
        removed, selection = select(scores, self.selector, self.num_layers, len(dense_layers),
                                    request.protected)
        log.info("depth pruning removes layers %s (%s scorer, %s selector)", removed, self.scorer.name,
                 self.selector)
        adapter.remove_layers(removed)
        details = {**scores.record(), "scorer": self.scorer.name, "selector": self.selector,
                   "protected_layers": sorted(request.protected), "selection": selection,
                   "layers_before": len(dense_layers), "layers_after": adapter.num_layers}
        if self.params_removed is not None:  # the achieved fraction, before any recovery adds operators
            details.update(params_removed=removed_fraction(dense_total, parameter_counts(adapter)["total"]),
                           params_removed_target=self.params_removed)
        return PruneReport(layer_targets=None, removed_layers=removed, details=details,
                           dense_layers=dense_layers)
