"""Swap-KL scorers: remove the layers another layer can best stand in for.

"No Free Swap" (seed method). The probe (`prunelab.probes.swap`) measures, for all pairs within
`max_distance`, the replacement distance d_repl(i, j) (slot i runs layer j's weights; max over both
directions by default) or the interchange distance d_int(i, j) (the two layers swap places). Layer
score s(i) = min over probed partners j of d(i, j); layers are removed by ascending score with no
two adjacent (`selector: nonadjacent`, the paper's rule) or, as the clustered variant, adjacent
ones allowed (`selector: lowest`).
Select with `pruning=depth pruning/scorer=swap_interchange` or `pruning/scorer=swap_replacement`.
Both matrices, the per-pair gap (replacement - interchange), the probe's cost and whether this run
measured it (`measured_here`; a sweep reads it from the calibration cache) go into the record.
"""

from __future__ import annotations

from prunelab.calibration import capture_layer_inputs
from prunelab.calibration.cache import cached
from prunelab.context import PruneContext
from prunelab.errors import ConfigError
from prunelab.probes.swap import POSITIONS, REDUCTIONS, SwapProbe, SwapProbeResult, layer_scores
from prunelab.pruning.scorers.base import LayerScores, ScoreRequest

PROTOCOLS = ("interchange", "replacement")


class SwapKL:
    selectors = ("nonadjacent", "lowest")
    plus_rule = False
    streamable = True  # the probe brings one decoder layer into memory at a time (`layer_in_memory`)

    def __init__(self, protocol: str = "interchange", max_distance: int = 3, reduce: str = "max",
                 positions: str = "all", nsamples: int | None = None, batch_size: int | None = 8):
        if protocol not in PROTOCOLS:
            raise ConfigError(f"pruning.scorer.protocol must be one of {PROTOCOLS}, not {protocol!r}")
        if reduce not in REDUCTIONS or positions not in POSITIONS:
            raise ConfigError(f"pruning.scorer: reduce in {REDUCTIONS}, positions in {POSITIONS}")
        if max_distance < 1:
            raise ConfigError("pruning.scorer.max_distance must be >= 1")
        if batch_size is not None and batch_size < 1:
            raise ConfigError("pruning.scorer.batch_size must be >= 1 (or null)")
        self.protocol, self.max_distance, self.reduce = protocol, max_distance, reduce
        self.positions, self.nsamples, self.batch_size = positions, nsamples, batch_size
        self.name = f"swap_{protocol}"

    def score(self, ctx: PruneContext, request: ScoreRequest) -> LayerScores:
        result, measured = self.probe(ctx)
        distance = result.interchange if self.protocol == "interchange" else result.replacement
        # the probe's cost is the measurement's; `measured_here` says whether this run paid it
        details = {"swap_probe": {**result.to_dict(), "measured_here": measured}}
        return LayerScores(per_layer=layer_scores(distance), details=details)

    def probe(self, ctx: PruneContext) -> tuple[SwapProbeResult, bool]:
        """Both matrices, measured once per model, calibration data and probe settings: the
        interchange and replacement scorers of a sweep (every depth) share one probe, the costly
        part (minutes on a real model), through the calibration cache. Returns (result, whether
        it was measured in this call rather than read from the cache)."""
        measured = []
        batch_size = self.batch_size or ctx.batch_size
        params = {"max_distance": self.max_distance, "reduce": self.reduce,
                  "positions": self.positions, "nsamples": self.nsamples, "batch_size": batch_size}

        def measure() -> dict:
            measured.append(True)
            samples = ctx.calibration()
            samples = samples[: self.nsamples] if self.nsamples else samples
            inputs = capture_layer_inputs(ctx.loaded.adapter, samples, batch_size)
            return SwapProbe(ctx.loaded.adapter, self.max_distance, self.reduce, self.positions,
                             progress=ctx.progress).run(inputs).to_tensors()

        result = SwapProbeResult.from_tensors(cached(ctx, "swap_probe", params, measure))
        return result, bool(measured)
