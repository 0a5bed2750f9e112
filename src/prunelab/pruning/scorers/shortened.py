"""Shortened LLaMA block criteria: weight magnitude, Taylor, and single-block-removal perplexity.

Kim et al., "Shortened LLaMA: Depth Pruning for Large Language Models", 2024.
  1. Score every block: Magnitude = sum |W| (no data, no forward pass: the forward-free
     baseline); Taylor = sum |W * dL/dW| (gradients of the calibration LM loss, summed over batches);
     PPL = calibration NLL of the model with that one block removed.
  2. Sum over the block's linear weights (attention and MLP projections).
  3. Remove the n blocks of lowest score (`selector: lowest`).
Select with `pruning/scorer=shortened_magnitude`, `shortened_taylor` or `shortened_ppl`.
The paper's "+" rule (keep blocks 0-3 and the last two) is on by default for the weight criteria
(Magnitude+, Taylor+) and off for PPL: `pruning.plus_rule=true|false` overrides it.
"""

from __future__ import annotations

from prunelab.calibration.gradients import backward_through
from prunelab.calibration.hidden_states import calibration_nll, progress_bar
from prunelab.context import PruneContext
from prunelab.pruning.scorers.base import LayerScores, ScoreRequest
from prunelab.scoring.layers import taylor_importance, weight_magnitude


class BlockMagnitude:
    name = "shortened_magnitude"
    selectors = ("lowest", "contiguous")
    plus_rule = True
    streamable = True  # one layer's weights at a time

    def score(self, ctx: PruneContext, request: ScoreRequest) -> LayerScores:
        adapter = ctx.loaded.adapter
        scores = [weight_magnitude(adapter.linear_weights(layer))
                  for _, layer in adapter.layers_in_memory()]
        return LayerScores(per_layer=scores)


class BlockTaylor:
    """Taylor = sum |W * dL/dW|, dL/dW summed over the calibration batches in float32 (a float16
    model's backward loss-scaled, a bfloat16 model's sums kept out of its `.grad`:
    `calibration.gradients`); a float32 model's scores are those of plain `.grad` accumulation."""

    name = "shortened_taylor"
    selectors = ("lowest", "contiguous")
    plus_rule = True
    streamable = True  # streamed: the backward one layer at a time (`backward_by_layer`)
    layer_gradients = True  # back-propagates: its graph and gradient sums are planned (models.memory)
    offloadable = False  # back-propagates through the whole model (accelerate-offloaded weights: none)

    def score(self, ctx: PruneContext, request: ScoreRequest) -> LayerScores:
        adapter = ctx.loaded.adapter
        scores = [0.0] * adapter.num_layers

        def taylor(index: int, weights: list, grads: list) -> None:
            scores[index] = taylor_importance(weights, grads)

        backward_through(adapter, ctx.calibration(), ctx.batch_size, adapter.linear_weights, taylor,
                         progress=ctx.progress, desc="taylor")
        return LayerScores(per_layer=scores)


class BlockPerplexity:
    name = "shortened_ppl"
    selectors = ("lowest", "contiguous")
    plus_rule = False
    streamable = True  # each candidate's NLL is one streamed pass over its layers (`calibration_nll`)

    def score(self, ctx: PruneContext, request: ScoreRequest) -> LayerScores:
        adapter = ctx.loaded.adapter
        samples, layers = ctx.calibration(), list(adapter.layers)
        scores = [calibration_nll(adapter, samples, ctx.batch_size, layers=layers[:i] + layers[i + 1:])
                  for i in progress_bar(range(len(layers)), ctx.progress, "single-block removal")]
        return LayerScores(per_layer=scores, details={"score": "calibration NLL without the block"})
