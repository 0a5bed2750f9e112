"""Random selection: the baseline every depth-pruning study needs.

  1. Draw one uniform number per layer from a generator seeded with the run's seed.
  2. Use it as the layer's score.
  3. Remove the n lowest (`selector: lowest`; `contiguous` draws a random block instead).
Select with `pruning=depth pruning/scorer=random`. Same seed, same layers.
"""

from __future__ import annotations

import torch

from prunelab.context import PruneContext
from prunelab.pruning.scorers.base import LayerScores, ScoreRequest


class RandomScorer:
    name = "random"
    streamable = True  # reads no weights: runs on a streamed model
    selectors = ("lowest", "contiguous")
    plus_rule = False

    def score(self, ctx: PruneContext, request: ScoreRequest) -> LayerScores:
        generator = torch.Generator().manual_seed(int(ctx.seed))
        return LayerScores(per_layer=torch.rand(request.num_layers, generator=generator).tolist())  # [L]
