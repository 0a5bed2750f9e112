"""SLEB: remove, one at a time, the block whose removal hurts the calibration NLL least.

Song et al., "SLEB: Streamlining LLMs through Redundancy Verification and Elimination of
Transformer Blocks", 2024.
  1. Start from all blocks alive.
  2. For every alive block except the first and the last alive one, measure the calibration NLL of
     the model without it (the blocks removed so far stay removed).
  3. Remove the block of lowest NLL; repeat n times (`selector: iterative`).
Select with `pruning=depth pruning/scorer=sleb`. The search happens in the scoring stage; the
record keeps every step's candidate NLLs. `layer_scores` holds the first step's (single-removal)
NLLs, None for the first and last block. On a streamed model (`model.streaming`) every candidate
reads each of its layers once: about n x L^2 layer reads in all, the same layer calls as in memory.
"""

from __future__ import annotations

from prunelab.calibration.hidden_states import calibration_nll, progress_bar
from prunelab.context import PruneContext
from prunelab.pruning.scorers.base import LayerScores, ScoreRequest


class Sleb:
    name = "sleb"
    selectors = ("iterative",)
    plus_rule = False
    streamable = True  # each candidate's NLL is one streamed pass over its layers (`calibration_nll`)

    def score(self, ctx: PruneContext, request: ScoreRequest) -> LayerScores:
        adapter = ctx.loaded.adapter
        samples = ctx.calibration()
        layers = list(adapter.layers)
        alive = list(range(request.num_layers))
        order: list[int] = []
        steps: list[dict[str, float]] = []
        for step in range(request.num_remove):
            candidates = [i for i in alive[1:-1] if i not in request.protected]
            nll: dict[int, float] = {}
            for i in progress_bar(candidates, ctx.progress, f"sleb step {step + 1}/{request.num_remove}"):
                kept = [layers[j] for j in alive if j != i]
                nll[i] = calibration_nll(adapter, samples, ctx.batch_size, layers=kept)
            if not nll:
                break  # the selector reports that too few layers could be removed
            best = min(nll, key=lambda i: (nll[i], i))
            order.append(best)
            alive.remove(best)
            steps.append({str(i): v for i, v in nll.items()})
        first = [steps[0].get(str(i)) if steps else None for i in range(request.num_layers)]
        return LayerScores(per_layer=None, order=order, block_starts=None,
                           details={"layer_scores": first, "step_nll": steps})
