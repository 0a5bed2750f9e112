"""Angular distance between a block's input and output (Gromov et al.; ReplaceMe's block choice).

Gromov et al., "The Unreasonable Ineffectiveness of the Deeper Layers", 2024.
  1. Run the calibration set through the dense model, keeping h_l for a window of n + 1 layers.
  2. d(l, n) = arccos(cos(h_l, h_{l+n})) / pi on the last token, averaged over the samples.
  3. Remove the contiguous block l..l+n-1 of smallest d (`selector: contiguous`).
Select with `pruning=depth pruning/scorer=angular`. `tokens: all` averages over every token
instead of the last one (memory: n + 1 layers' activations alive instead of n + 1 [N, C] rows).
h_L is taken before the final norm (transformers' last `output_hidden_states` entry is normed).
ReplaceMe never prunes layer 0: add `pruning.protect_first=1` to reproduce its choice.
"""

from __future__ import annotations

import torch

from prunelab.calibration.hidden_states import block_term_means
from prunelab.context import PruneContext
from prunelab.errors import check_choice
from prunelab.pruning.scorers.base import LayerScores, ScoreRequest
from prunelab.scoring.layers import TOKEN_SETS, angular_distance, select_tokens


def last_token(h: torch.Tensor) -> torch.Tensor:
    """[B, T, C] -> [B, 1, C]: the only rows the last-token distance reads."""
    return select_tokens(h, "last")[:, None, :]


def token_angular_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """[B, T, C] x2 -> [B*T] angular distance per token."""
    return angular_distance(select_tokens(a, "all"), select_tokens(b, "all"))


class AngularDistance:
    name = "angular"
    streamable = True  # hidden states only, through the layer runner: runs on a streamed model
    selectors = ("contiguous",)
    plus_rule = False

    def __init__(self, tokens: str = "last"):
        check_choice("pruning.scorer.tokens", tokens, TOKEN_SETS)
        self.tokens = tokens

    def score(self, ctx: PruneContext, request: ScoreRequest) -> LayerScores:
        n, num_layers = request.num_remove, request.num_layers
        block: list[float | None] = [None] * num_layers
        if n > 0:
            block = block_term_means(
                ctx.loaded.adapter, ctx.calibration(), n, term=token_angular_distance,
                batch_size=ctx.batch_size, progress=ctx.progress, desc="angular distance",
                keep=last_token if self.tokens == "last" else None)
        return LayerScores(block_starts=block, details={"tokens": self.tokens, "block_size": n})
