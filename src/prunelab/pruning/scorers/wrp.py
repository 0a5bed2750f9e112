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

import torch

from prunelab.calibration.hidden_states import progress_bar
from prunelab.context import PruneContext
from prunelab.errors import ConfigError
from prunelab.pruning.scorers.base import LayerScores, ScoreRequest, json_floats
from prunelab.scoring.wrp import (FORMS, combine_writers, frobenius_norms, redundancy_scores,
                                  similarity_parts, wrp_matrix, writer_row)


class WeightRedundancy:
    name = "wrp"
    selectors = ("cluster", "lowest")
    plus_rule = False
    streamable = True  # streamed: each layer read once for its writer rows (`writer_row`)
    offloadable = False  # in memory, every writer's weights are read at once

    def __init__(self, form: str = "gram"):
        if form not in FORMS:
            raise ConfigError(f"pruning.scorer.form must be one of {FORMS}, not {form!r}")
        self.form = form

    def score(self, ctx: PruneContext, request: ScoreRequest) -> LayerScores:
        adapter = ctx.loaded.adapter
        if adapter.streamed:
            mats = self._streamed_matrix(adapter, ctx.progress)
        else:
            writers = [adapter.residual_writers(layer) for layer in adapter.layers]
            mats = wrp_matrix([a.weight for a, _ in writers], [m.weight for _, m in writers], self.form)
        details: dict = {"form": self.form}
        for key, matrix in mats.items():  # per-writer parts; the combined matrix is `pairwise`
            if key != "similarity":
                details[f"pairwise_{key}"] = [json_floats(row) for row in matrix]
        return LayerScores(per_layer=redundancy_scores(mats["similarity"]).tolist(),
                           pairwise=mats["similarity"].tolist(), details=details)

    def _streamed_matrix(self, adapter, progress: bool = True) -> dict:
        """`wrp_matrix` with one layer in memory at a time: the same rows, stacked in place."""
        store, n = adapter.store, adapter.num_layers
        rows: dict[int, torch.Tensor] = {}  # writer (0: attention, 1: MLP) -> [L, D]
        norms: dict[int, list[torch.Tensor]] = {0: [], 1: []}  # writer -> L norms, each [1]
        for index, layer in progress_bar(adapter.layers_in_memory(), progress, "wrp: writer rows"):
            for writer, linear in enumerate(adapter.residual_writers(layer)):
                row = writer_row(linear.weight, self.form)  # [D]
                if writer not in rows:
                    with store.spilling_beyond_budget(2 * n * row.numel() * row.element_size()):
                        rows[writer] = store.empty_activation((n, row.numel()), row.dtype)  # [L, D]
                rows[writer][index] = row
                # beside the rows, which live on the host (a GPU layer's are copied there)
                norms[writer].append(frobenius_norms([linear.weight]).to(rows[writer].device))
        attn, mlp = (similarity_parts(rows[w], torch.cat(norms[w]), self.form) for w in (0, 1))
        return combine_writers(attn, mlp)
