"""Probes: diagnostics of layer equivalence (swap-KL replacement vs interchange)."""

from prunelab.probes.swap import SwapProbe, SwapProbeResult, layer_scores, token_kl

__all__ = ["SwapProbe", "SwapProbeResult", "layer_scores", "token_kl"]
