"""Calibration: the layer-sequential runner and the hooks that gather input statistics."""

from prunelab.calibration.runner import (
    LayerInputs, LayerSequentialRunner, LayerStep, capture_layer_inputs, move_to,
)
from prunelab.calibration.statistics import InputStatistic, SquaredColumnNorm, collect_linear_inputs

__all__ = [
    "InputStatistic", "LayerInputs", "LayerSequentialRunner", "LayerStep", "SquaredColumnNorm",
    "capture_layer_inputs", "collect_linear_inputs", "move_to",
]
