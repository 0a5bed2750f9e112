"""WRP: forward-free depth pruning from the similarity of the weights that write the residual.

Seed method (no public code), scored by `prunelab.scoring.wrp`.
  1. For every pair of layers, compare the attention output and MLP output projections
     (Gram form: linear CKA of W W^T; or the literal raw-weight cosine), times min/max of their norms.
  2. Average the two writers into an all-pairs similarity matrix S [L, L].
  3. Group adjacent layers by average-linkage similarity and keep one per group (`selector: cluster`).
Select with `pruning=depth pruning/scorer=wrp` (`form: gram | raw`). No data, no forward pass.
`selector: lowest` removes the layers of highest similarity to any other layer instead.
"""

from __future__ import annotations

from prunelab.context import PruneContext
from prunelab.errors import ConfigError
from prunelab.pruning.scorers.base import LayerScores, ScoreRequest, json_floats
from prunelab.scoring.wrp import FORMS, redundancy_scores, wrp_matrix


class WeightRedundancy:
    name = "wrp"
    selectors = ("cluster", "lowest")
    plus_rule = False

    def __init__(self, form: str = "gram"):
        if form not in FORMS:
            raise ConfigError(f"pruning.scorer.form must be one of {FORMS}, not {form!r}")
        self.form = form

    def score(self, ctx: PruneContext, request: ScoreRequest) -> LayerScores:
        adapter = ctx.loaded.adapter
        writers = [adapter.residual_writers(layer) for layer in adapter.layers]
        mats = wrp_matrix([a.weight for a, _ in writers], [m.weight for _, m in writers], self.form)
        details: dict = {"form": self.form}
        for key, matrix in mats.items():  # per-writer parts; the combined matrix is `pairwise`
            if key != "similarity":
                details[f"pairwise_{key}"] = [json_floats(row) for row in matrix]
        return LayerScores(per_layer=redundancy_scores(mats["similarity"]).tolist(),
                           pairwise=mats["similarity"].tolist(), details=details)
