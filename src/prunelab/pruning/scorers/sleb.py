"""SLEB: remove, one at a time, the block whose removal hurts the calibration NLL least.

Song et al., "SLEB: Streamlining LLMs through Redundancy Verification and Elimination of
Transformer Blocks", 2024.
  1. Start from all blocks alive.
  2. For every alive block except the first and the last alive one, measure the calibration NLL of
     the model without it (the blocks removed so far stay removed).
  3. Remove the block of lowest NLL; repeat n times (`selector: iterative`).
Select with `pruning=depth pruning/scorer=sleb`. The search happens in the scoring stage; the
record keeps every step's candidate NLLs. `layer_scores` holds the first step's (single-removal)
NLLs, None for the first and last block.

Cost: each step measures about L candidates. In memory, the candidates share one pass over their
common prefixes (`removal_nlls`: the same numbers, about half the layer calls). Each step's NLLs
go through the calibration cache, keyed by the model, the calibration data and the blocks alive:
the search is greedy, so a sweep's run at 10% of parameters removed replays the first steps of the
run at 20% and only the steps past the cached ones are measured (`steps_measured_here` in the
record). On a streamed model (`model.streaming`) every candidate reads each of its layers once:
about n x L^2 layer reads in all, the same layer calls as in memory.
"""

from __future__ import annotations

from prunelab.calibration.cache import cached
from prunelab.calibration.hidden_states import removal_nlls
from prunelab.context import PruneContext
from prunelab.pruning.scorers.base import LayerScores, ScoreRequest


class Sleb:
    name = "sleb"
    selectors = ("iterative",)
    plus_rule = False
    streamable = True  # streamed, each candidate's NLL is one pass over its layers (`removal_nlls`)

    def score(self, ctx: PruneContext, request: ScoreRequest) -> LayerScores:
        adapter = ctx.loaded.adapter
        samples = ctx.calibration()
        layers = list(adapter.layers)
        alive = list(range(request.num_layers))
        order: list[int] = []
        steps: list[dict[str, float]] = []
        measured = 0
        for step in range(request.num_remove):
            candidates = [i for i in alive[1:-1] if i not in request.protected]
            if not candidates:
                break  # the selector reports that too few layers could be removed

            def measure(step=step, candidates=candidates) -> dict[str, float]:
                nonlocal measured
                measured += 1
                by_position = removal_nlls(adapter, samples, [layers[j] for j in alive],
                                           [alive.index(i) for i in candidates], ctx.batch_size,
                                           ctx.progress, f"sleb step {step + 1}/{request.num_remove}")
                return {str(alive[k]): v for k, v in by_position.items()}

            params = {"alive": alive, "candidates": candidates, "batch_size": ctx.batch_size}
            nll = {int(i): float(v) for i, v in cached(ctx, "sleb_step", params, measure).items()}
            best = min(nll, key=lambda i: (nll[i], i))
            order.append(best)
            alive.remove(best)
            steps.append({str(i): nll[i] for i in candidates})
        first = [steps[0].get(str(i)) if steps else None for i in range(request.num_layers)]
        return LayerScores(per_layer=None, order=order, block_starts=None,
                           details={"layer_scores": first, "step_nll": steps,
                                    "steps_measured_here": measured})
