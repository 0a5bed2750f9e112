"""ShortGPT block influence: remove the layers that change the hidden state least.

Men et al., "ShortGPT: Layers in Large Language Models are More Redundant Than You Expect", 2024.
  1. Run the calibration set through the dense model, layer by layer.
  2. BI_l = 1 - mean over tokens of cos(h_l, h_{l+1}), the cosine taken over the hidden dimension.
  3. Remove the n layers of lowest BI (`selector: lowest`).
Select with `pruning=depth pruning/scorer=block_influence` (the depth default).
Quirk: the LinearPatch and Ghosted code call `cosine_similarity` with its default dim=1 on
[B, T, C] tensors, a cosine over tokens; `cosine_dim: tokens` reproduces it (default `hidden`).
"""

from __future__ import annotations

from prunelab.calibration.hidden_states import iter_hidden_states, iter_state_pairs
from prunelab.context import PruneContext
from prunelab.errors import check_choice
from prunelab.pruning.scorers.base import LayerScores, ScoreRequest
from prunelab.scoring.layers import COSINE_DIMS, RunningMean, cosine_terms


class BlockInfluence:
    name = "block_influence"
    streamable = True  # hidden states only, through the layer runner: runs on a streamed model
    selectors = ("lowest", "contiguous")
    plus_rule = False

    def __init__(self, cosine_dim: str = "hidden"):
        check_choice("pruning.scorer.cosine_dim", cosine_dim, COSINE_DIMS)
        self.cosine_dim = cosine_dim

    def score(self, ctx: PruneContext, request: ScoreRequest) -> LayerScores:
        adapter = ctx.loaded.adapter
        states = iter_hidden_states(adapter, ctx.calibration(), ctx.batch_size, ctx.progress,
                                    desc="block influence")
        scores = []
        for _, h_in, h_out in iter_state_pairs(states, 1):
            mean_cos = RunningMean()
            for a, b in zip(h_in, h_out):  # [B, T, C] each
                mean_cos.update(cosine_terms(a, b, self.cosine_dim))  # [B*T] or [B*C]
            scores.append(1.0 - mean_cos.value)
        return LayerScores(per_layer=scores, details={"cosine_dim": self.cosine_dim})
