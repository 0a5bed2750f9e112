"""Calibration: every pass over the calibration set lives here.

- `runner`: capture layer 0's inputs, visit the decoder layers one by one (`LayerSequentialRunner`);
- `passes`: the set-up every layer-sequential pass shares (`layer_pass`, linears by role, the dense
  per-role statistics pass);
- `statistics`: the hooked input statistics (squared norms, Hessians, |x| histograms);
- `dense_statistics`: what allocation policies read about the dense model, cached (`cache`);
- `hidden_states`: hidden states and boundary states for depth pruning and its recovery;
- `gradients`: LM-loss gradients of chosen weights.
"""

from prunelab.calibration.runner import (
    LayerInputs, LayerSequentialRunner, LayerStep, capture_layer_inputs, move_to,
)
from prunelab.calibration.statistics import InputStatistic, SquaredColumnNorm, collect_linear_inputs

__all__ = [
    "InputStatistic", "LayerInputs", "LayerSequentialRunner", "LayerStep", "SquaredColumnNorm",
    "capture_layer_inputs", "collect_linear_inputs", "move_to",
]
