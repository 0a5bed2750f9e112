"""Per-weight importance scores: pure functions of a weight matrix and calibration statistics."""

from __future__ import annotations

import torch


def magnitude_scores(weight: torch.Tensor) -> torch.Tensor:
    """|W|: the data-free baseline. weight: [out, in] -> [out, in]."""
    return weight.detach().abs().float()
