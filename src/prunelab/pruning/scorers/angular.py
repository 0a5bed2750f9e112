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

from prunelab.calibration.hidden_states import iter_hidden_states, iter_state_pairs
from prunelab.errors import ConfigError
from prunelab.pruning.base import PruneContext
from prunelab.pruning.scorers.base import LayerScores, ScoreRequest
from prunelab.scoring.layers import TOKEN_SETS, RunningMean, angular_distance, select_tokens


class AngularDistance:
    name = "angular"
    selectors = ("contiguous",)
    plus_rule = False

    def __init__(self, tokens: str = "last"):
        if tokens not in TOKEN_SETS:
            raise ConfigError(f"pruning.scorer.tokens must be one of {TOKEN_SETS}, not {tokens!r}")
        self.tokens = tokens

    def score(self, ctx: PruneContext, request: ScoreRequest) -> LayerScores:
        n, num_layers = request.num_remove, request.num_layers
        block: list[float | None] = [None] * num_layers
        if n > 0:
            states = iter_hidden_states(ctx.loaded.adapter, ctx.calibration(), ctx.batch_size,
                                        ctx.progress, desc="angular distance")
            if self.tokens == "last":  # keep only [B, C] rows per layer
                states = ((i, [select_tokens(h, "last")[:, None, :] for h in hs]) for i, hs in states)
            for start, h_in, h_out in iter_state_pairs(states, n):
                mean = RunningMean()
                for a, b in zip(h_in, h_out):  # [B, T', C]
                    rows_a, rows_b = select_tokens(a, "all"), select_tokens(b, "all")  # [B*T', C]
                    mean.update(angular_distance(rows_a, rows_b))  # [B*T']
                block[start] = mean.value
        return LayerScores(block_starts=block, details={"tokens": self.tokens, "block_size": n})
