"""SliceGPT: rotate each residual-stream point to its principal components, then delete the
smallest ones (rows and columns of every weight that reads or writes the residual stream).

Ashkboos, Croci, do Nascimento, Hoefler & Hensman, "SliceGPT: Compress Large Language Models by
Deleting Rows and Columns", ICLR 2024 (microsoft/TransformerCompression,
`rotate.rotate_and_slice_sequential`, `experiments/run_slicegpt.py`). Select with `pruning=slicegpt`
(conf/pruning/slicegpt.yaml). The reference's steps and arithmetic:
1. fuse the norms into the adjacent linears (`models.slicing.fuse_norms`: embeddings' mean
   subtracted even for RMSNorm, head untied);
2. PCA of the layer-0 inputs (`scoring.slicegpt.pca_calc`) rotates and slices the embeddings;
3. per layer, in order: the rotated, sliced inputs go through the layer; the PCA of its MLP-norm
   input rotates o_proj's rows and gate/up's columns, the PCA of its outputs rotates down_proj's
   rows; the shortcut matrices carry the residual from one basis (and width) to the next;
4. the head is rotated by the last basis and never sliced, so the last layer writes the full width.
`sparsity` is the fraction of the hidden dimension sliced: d = int((1 - sparsity) D) rounded down
to a multiple of `round_interval` (8), the same d everywhere. `params_removed` replaces it with a
budget shared with the other width and depth methods (`pruning.parameter_budget`): the multiple of
`round_interval` whose sliced model comes nearest to that fraction of the dense parameters removed
(counted from the shapes before anything is touched: `models.slicing.slicing_parameter_change`). `final_orientation: random` (the
reference's default) multiplies each kept basis by a random orthogonal matrix, drawn here from a
RandomState seeded with the run's seed (the reference's np.random is unseeded: seeded with the same
number its draws are these); `pca` keeps the principal axes. Either way the function is the same up
to rounding. `calibration_batch_size` (16, the script's `--cal-batch-size`) is how many sequences
go through a layer at once: the reference sums each PCA's X^T X batch by batch, so another batch
size changes the float32 activations and the sums in their last bits (batch 1: eigenvalues within
1.6e-4 relative, some eigenvectors with the other sign); null takes `runtime.calibration_batch_size`.
Measured against the official `rotate_and_slice` on all 30 layers of SmolLM2-135M (32 x 256 realtext
tokens; `experiments/benchmarks/official_slicegpt.py`, `results/benchmarks/official_slicegpt.md`):
at these defaults (and with `final_orientation=pca`, sparsity 0.25 and 0.3) every eigenvalue, every
sliced tensor and the logits are bit-identical, `random` once `np.random.seed(seed)` is called
before the official run.
The model returned is not always smaller: the head is untied from the embeddings and every layer
gains two d x d shortcut matrices, so a small model (SmolLM2-135M at 0.25) has MORE parameters
than dense; the record counts the model actually returned.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch

from prunelab.calibration.hidden_states import progress_bar
from prunelab.calibration.runner import LayerInputs, capture_layer_inputs
from prunelab.calibration.slicing import layer_signals
from prunelab.context import PruneContext, PruneReport
from prunelab.errors import ConfigError, check_choice
from prunelab.models.adapter import ModelAdapter
from prunelab.models.slicing import (attention_inputs, check_sliceable, fuse_norms, mlp_inputs, record_slicing,
                                     rotate_and_slice_embeddings, rotate_inputs, rotate_output, set_shortcut,
                                     shortcut_layer, slice_inputs, slice_output, slicing_parameter_change)
from prunelab.pruning.parameter_budget import TOLERANCE, check_fraction, dimension_for_fraction, removed_fraction
from prunelab.pruning.report import layer_parameters, parameter_counts
from prunelab.scoring.slicegpt import pca_calc, random_orthogonal_upper_left, sliced_dimension

log = logging.getLogger(__name__)
ORIENTATIONS = ("random", "pca")


class SliceGPT:
    name = "slicegpt"
    changes_shapes = True  # the efficiency evaluator measures it by default (evaluation.efficiency)
    streamable = False

    def __init__(self, sparsity: float | None = None, params_removed: float | None = None, round_interval: int = 8,
                 final_orientation: str = "random", calibration_batch_size: int | None = 16):
        check_fraction(params_removed)
        if params_removed is not None and sparsity is not None:
            raise ConfigError(f"pruning.sparsity={sparsity!r} and pruning.params_removed={params_removed!r} both set "
                              f"the amount to prune: set one (the other null)")
        if params_removed is None:
            sparsity = 0.25 if sparsity is None else sparsity  # the reference's default
        if params_removed is None and (isinstance(sparsity, bool) or not isinstance(sparsity, (int, float))
                                       or not 0 < sparsity < 1):
            raise ConfigError(f"pruning.sparsity is the fraction of the hidden dimension sliced, in (0, 1), "
                              f"not {sparsity!r}")
        if isinstance(round_interval, bool) or not isinstance(round_interval, int) or round_interval < 1:
            raise ConfigError(f"pruning.round_interval must be a positive integer, not {round_interval!r}")
        check_choice("pruning.final_orientation", final_orientation, ORIENTATIONS)
        if calibration_batch_size is not None and (isinstance(calibration_batch_size, bool)
                                                   or not isinstance(calibration_batch_size, int)
                                                   or calibration_batch_size < 1):
            raise ConfigError(f"pruning.calibration_batch_size must be a positive integer or null (the run's "
                              f"runtime.calibration_batch_size), not {calibration_batch_size!r}")
        self.calibration_batch_size = calibration_batch_size
        self.sparsity = None if params_removed is not None else float(sparsity)
        self.params_removed, self.round_interval, self.final_orientation = params_removed, round_interval, final_orientation

    def check_model(self, adapter: ModelAdapter, name: str | None = None) -> None:
        """Refuse a model SliceGPT cannot rewrite, before any work (`models.slicing.check_sliceable`)."""
        check_sliceable(adapter, name)

    def labels(self) -> dict[str, Any]:
        return {"method": self.name, "sparsity": self.sparsity, "params_removed": self.params_removed,
                "final_orientation": self.final_orientation}

    def score(self, ctx: PruneContext) -> int:
        """Every check before any weight is touched; the kept dimension."""
        adapter = ctx.loaded.adapter
        check_sliceable(adapter)
        if self.params_removed is not None:
            return dimension_for_fraction(lambda d: slicing_parameter_change(adapter, d),
                                          parameter_counts(adapter)["total"], self.params_removed,
                                          adapter.hidden_size, self.round_interval)
        dim = sliced_dimension(adapter.hidden_size, self.sparsity, self.round_interval)
        if dim >= adapter.hidden_size:
            raise ConfigError(f"SliceGPT at sparsity {self.sparsity} with round_interval {self.round_interval} "
                              f"slices nothing of the hidden size {adapter.hidden_size}")
        return dim

    @torch.no_grad()
    def prune(self, ctx: PruneContext, dim: int) -> PruneReport:
        adapter = ctx.loaded.adapter
        hidden, n = adapter.hidden_size, adapter.num_layers
        dense_total, dense_layers = parameter_counts(adapter)["total"], layer_parameters(adapter)
        dtype = next(adapter.model.parameters()).dtype
        rng = np.random.RandomState(ctx.seed)

        def orient(Q: torch.Tensor, kept: int) -> torch.Tensor:
            if self.final_orientation == "random":
                return Q @ random_orthogonal_upper_left(Q.shape[0], kept, rng).to(Q.device)
            return Q

        fuse_norms(adapter)
        batch_size = self.calibration_batch_size or ctx.batch_size  # the reference's batches: see the docstring
        inputs = capture_layer_inputs(adapter, ctx.calibration(), batch_size)
        eigenvalues: list[list[float]] = []
        values, Q = pca_calc(inputs.hidden)
        eigenvalues.append(values.tolist())
        Q = orient(Q, dim)  # [D, D] float64
        rotate_and_slice_embeddings(adapter, Q, dim)
        for index, layer in progress_bar(enumerate(adapter.layers), ctx.progress, "slicegpt: rotate and slice"):
            out_dim = hidden if index == n - 1 else dim  # the head is not sliced
            shortcut_layer(adapter, layer)
            attn_out, mlp_out = adapter.residual_writers(layer)
            device = attn_out.weight.device
            set_shortcut(layer, "attn_shortcut_Q", Q.T.clone().to(device=device, dtype=dtype)[:dim, :])  # [d, D]
            rotate_inputs(attention_inputs(adapter, layer), Q)
            slice_inputs(attention_inputs(adapter, layer), dim)
            Qd = Q.to(dtype=dtype)
            hidden_in = [torch.matmul(h, Qd.to(h.device))[:, :, :dim] for h in inputs.hidden]  # [B, T, d]
            mids, _ = layer_signals(adapter, layer, LayerInputs(hidden_in, inputs.kwargs))
            values, Q = pca_calc(mids)
            eigenvalues.append(values.tolist())
            Q = orient(Q, dim)
            set_shortcut(layer, "attn_shortcut_Q",
                         torch.matmul(layer.attn_shortcut_Q, Q.to(device=device, dtype=dtype)[:, :dim]))  # [d, d]
            rotate_output(attn_out, Q)
            slice_output(attn_out, dim)
            set_shortcut(layer, "mlp_shortcut_Q", Q.T.clone().to(device=device, dtype=dtype)[:dim, :])  # [d, D]
            rotate_inputs(mlp_inputs(adapter, layer), Q)
            slice_inputs(mlp_inputs(adapter, layer), dim)
            _, outputs = layer_signals(adapter, layer, LayerInputs(hidden_in, inputs.kwargs))
            values, Q = pca_calc(outputs)
            eigenvalues.append(values.tolist())
            Q = orient(Q, out_dim)
            set_shortcut(layer, "mlp_shortcut_Q",
                         torch.matmul(layer.mlp_shortcut_Q, Q.to(device=device, dtype=dtype))[:, :out_dim])  # [d, out]
            rotate_output(mlp_out, Q)
            slice_output(mlp_out, out_dim)
            inputs = LayerInputs(outputs, inputs.kwargs)  # in the dense basis, as the reference
        rotate_inputs([adapter.lm_head], Q)
        record_slicing(adapter)
        pruned_total = parameter_counts(adapter)["total"]
        after = layer_parameters(adapter)
        achieved = removed_fraction(dense_total, pruned_total)
        log.info("SliceGPT: hidden %d -> %d; %d -> %d parameters (%.2f%% removed)", hidden, dim, dense_total,
                 pruned_total, 100 * achieved)
        if self.params_removed is not None and abs(achieved - self.params_removed) > TOLERANCE:
            log.warning("SliceGPT removed %.4f of the parameters, target %.4f (the nearest kept dimension in "
                        "steps of %d)", achieved, self.params_removed, self.round_interval)
        details = {"width": {
            "dense_hidden_size": hidden, "sliced_dimension": dim,
            "parameters_before": dense_total, "parameters_after": pruned_total,
            "params_removed_target": self.params_removed, "params_removed": achieved,
            "per_layer": [{"layer": i, "parameters_before": dense_layers[i], "parameters_after": after[i]}
                          for i in range(n)]},
            "eigenvalues": eigenvalues}
        return PruneReport(layer_targets=None, details=details)
