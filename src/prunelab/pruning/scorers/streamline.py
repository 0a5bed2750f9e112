"""LLM-Streamline block selection: the contiguous block whose input and output are most similar.

Chen et al., "Compressing Large Language Models by Streamlining the Unimportant Layer", 2024.
  1. Run the calibration set through the dense model, keeping h_j for a window of n + 1 layers.
  2. s_j = mean over tokens of cos(h_j, h_{j+n}) (cosine over the hidden dimension).
  3. Remove layers j*..j*+n-1 with j* = argmax_j s_j; the score recorded is 1 - s_j (lower = removed).
Select with `pruning=depth pruning/scorer=streamline`.
Quirk: the LinearPatch / Ghosted code compute this cosine with dim=1 on [B, T, C] (over tokens):
`cosine_dim: tokens`. Their search also skips start 0 and the block ending at the last layer:
`pruning.protect_first=1 pruning.protect_last=1`.
"""

from __future__ import annotations

from prunelab.calibration.hidden_states import block_term_means
from prunelab.context import PruneContext
from prunelab.errors import check_choice
from prunelab.pruning.scorers.base import LayerScores, ScoreRequest
from prunelab.scoring.layers import COSINE_DIMS, cosine_terms


class Streamline:
    name = "streamline"
    streamable = True  # hidden states only, through the layer runner: runs on a streamed model
    selectors = ("contiguous",)
    plus_rule = False

    def __init__(self, cosine_dim: str = "hidden"):
        check_choice("pruning.scorer.cosine_dim", cosine_dim, COSINE_DIMS)
        self.cosine_dim = cosine_dim

    def score(self, ctx: PruneContext, request: ScoreRequest) -> LayerScores:
        n, num_layers = request.num_remove, request.num_layers
        block: list[float | None] = [None] * num_layers
        if n > 0:
            similarity = block_term_means(
                ctx.loaded.adapter, ctx.calibration(), n, batch_size=ctx.batch_size, progress=ctx.progress,
                desc="streamline", term=lambda a, b: cosine_terms(a, b, self.cosine_dim))
            block = [None if s is None else 1.0 - s for s in similarity]
        return LayerScores(block_starts=block, details={"cosine_dim": self.cosine_dim, "block_size": n})
