"""Massive activations: how far the residual stream's largest entries stand above the rest.

Sun et al. (2024), "Massive Activations in Large Language Models", arXiv:2402.17762: in pretrained
LLMs a few fixed hidden dimensions carry values thousands of times the median |h|; OWL and PALS
allocate sparsity from such outliers, and Wanda's |W|·||X|| score exists because of them. A model
without them (the shipped testbed) cannot test those methods' claims; this probe says which kind of
model one has.

Per state h_l entering layer l (and h_L after the last layer): max |h|, median |h|, their ratio,
and the dimension holding the maximum.

    prunelab activations testbed_llama smollm2_135m  [--samples 4 --seqlen 256]   (prunelab.commands)
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import torch

from prunelab.calibration.hidden_states import iter_hidden_states
from prunelab.models.adapter import ModelAdapter


@dataclass(frozen=True)
class StateProfile:
    layer: int          # h_layer: the input of decoder layer `layer` (L = after the last layer)
    max_abs: float
    median_abs: float
    ratio: float        # max / median
    top_dim: int        # hidden dimension of the largest |h|


@torch.no_grad()
def profile(adapter: ModelAdapter, samples: torch.Tensor, batch_size: int = 1,
            progress: bool = False) -> list[StateProfile]:
    """[L + 1] profiles of the residual stream over the token windows `samples` ([N, T])."""
    out = []
    for index, hidden in iter_hidden_states(adapter, samples, batch_size, progress, desc="activations"):
        states = torch.cat([h.reshape(-1, h.shape[-1]) for h in hidden]).abs().float()  # [N*T, C]
        flat_max = int(states.argmax())
        max_abs, median_abs = float(states.max()), float(states.median())
        out.append(StateProfile(index, max_abs, median_abs, max_abs / max(median_abs, 1e-12),
                                flat_max % states.shape[1]))
    return out


def summary(profiles: list[StateProfile]) -> dict:
    """The largest ratio, where it is, and which dimensions hold the maximum most often."""
    peak = max(profiles, key=lambda p: p.ratio)
    return {"max_ratio": peak.ratio, "at_state": peak.layer, "max_abs": peak.max_abs,
            "top_dims": Counter(p.top_dim for p in profiles).most_common(3)}
