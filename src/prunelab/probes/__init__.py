"""Probes: diagnostics of layer equivalence (swap-KL replacement vs interchange)."""

from prunelab.probes.swap import SwapProbe, SwapProbeResult, greedy_removal, layer_scores, token_kl

__all__ = ["SwapProbe", "SwapProbeResult", "greedy_removal", "layer_scores", "token_kl"]
