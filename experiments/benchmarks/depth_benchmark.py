"""Benchmark: time and peak memory of depth scorers, the swap-KL probe and recoveries.

On testbed_llama and on a randomly initialised Llama of about 1.1B parameters (fp32, CPU, a few
short calibration sequences). For the swap probe, the cached-prefix cost is compared with the naive
cost (one full forward pass per probed variant), both as counted layer calls and as wall time
(naive time = measured full-pass time x variants).

    python experiments/benchmarks/depth_benchmark.py --out results/benchmarks
"""

from __future__ import annotations

import argparse
import gc
import importlib
import platform
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import torch

from prunelab.benchmark import StageMeasurements, keep_unmeasured_rows
from prunelab.calibration import capture_layer_inputs
from prunelab.context import PruneContext
from prunelab.data import CalibrationSpec, calibration_samples
from prunelab.models import ModelSpec, load_model
from prunelab.probes.swap import SwapProbe
from prunelab.pruning.depth import DepthPruning
from prunelab.recovery.base import RecoveryContext

sys.path.insert(0, str(Path(__file__).parent))
from prune_benchmark import random_llama_1b  # noqa: E402

SCORERS = {
    "block_influence": ("prunelab.pruning.scorers.block_influence", "BlockInfluence", {}),
    "angular": ("prunelab.pruning.scorers.angular", "AngularDistance", {}),
    "streamline": ("prunelab.pruning.scorers.streamline", "Streamline", {}),
    "shortened_magnitude": ("prunelab.pruning.scorers.shortened", "BlockMagnitude", {}),
    "wrp": ("prunelab.pruning.scorers.wrp", "WeightRedundancy", {}),
    "sleb": ("prunelab.pruning.scorers.sleb", "Sleb", {}),
}
RECOVERIES = {
    "linear_patch_r": ("prunelab.recovery.linear_patch", "LinearPatch", {"rotate": True}),
    "replaceme": ("prunelab.recovery.replaceme", "ReplaceMe", {}),
    "ghosted": ("prunelab.recovery.ghosted", "Ghosted", {}),
}


def build(entry):
    module, cls, kwargs = entry
    return getattr(importlib.import_module(module), cls)(**kwargs)


def context(spec: ModelSpec, nsamples: int, seqlen: int):
    loaded = load_model(spec)
    samples = calibration_samples(CalibrationSpec("testbed", nsamples, seqlen), loaded.tokenizer, 0)
    return loaded, PruneContext(loaded, 0, lambda: samples, progress=True)


def bench_model(label: str, spec: ModelSpec, nsamples: int, seqlen: int, scorers: list[str],
                probe_distance: int, m: StageMeasurements, probe_rows: list[dict]) -> None:
    loaded, ctx = context(spec, nsamples, seqlen)
    for name in scorers:
        method = DepthPruning(build(SCORERS[name]), num_layers=2, protect_first=1)
        with m.stage("score", model=label, what=name):
            method.score(ctx)
    # swap-KL probe: cached prefixes against one full pass per variant
    inputs = capture_layer_inputs(loaded.adapter, ctx.calibration(), batch_size=8)  # the scorer's default
    with m.stage("score", model=label, what=f"swap_probe(d={probe_distance})"):
        result = SwapProbe(loaded.adapter, max_distance=probe_distance, progress=True).run(inputs)
    start = time.perf_counter()
    with torch.no_grad():
        loaded.model(input_ids=ctx.calibration(), use_cache=False)
    full_pass = time.perf_counter() - start
    variants = 3 * len(result.pairs)
    probe_rows.append({"model": label, "max_distance": probe_distance, "pairs": len(result.pairs),
                       "layer_calls": result.cost.layer_calls, "naive_layer_calls": result.cost.naive_layer_calls,
                       "layer_call_ratio": result.cost.ratio, "probe_seconds": m.rows[-1]["seconds"],
                       "naive_seconds_estimate": full_pass * (variants + 1),
                       "time_ratio": m.rows[-1]["seconds"] / (full_pass * (variants + 1))})
    del loaded, ctx, inputs
    for name, entry in RECOVERIES.items():
        gc.collect()
        loaded, ctx = context(spec, nsamples, seqlen)
        method = DepthPruning(build(SCORERS["block_influence"]), num_layers=2, protect_first=1)
        report = method.prune(ctx, method.score(ctx))
        with m.stage("recover", model=label, what=name):
            build(entry).recover(RecoveryContext(ctx, report))
        del loaded, ctx, report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("results/benchmarks"))
    parser.add_argument("--skip-1b", action="store_true",
                        help="measure testbed_llama only; keep the 1.1B rows already in the CSV")
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    m, probe_rows = StageMeasurements(), []
    bench_model("testbed_llama", ModelSpec("testbed_llama", device="cpu"), 32, 256, list(SCORERS), 3, m,
                probe_rows)
    if not args.skip_1b:
        with tempfile.TemporaryDirectory() as tmp:
            path = random_llama_1b(Path(tmp) / "llama_1b")
            # SLEB needs (layers x removed) full passes: minutes per pass at 1B on 2 CPU cores, skipped
            bench_model("random_llama_1.1b", ModelSpec(str(path), device="cpu"), 4, 128,
                        [s for s in SCORERS if s != "sleb"], 1, m, probe_rows)
    args.out.mkdir(parents=True, exist_ok=True)
    table, probe = pd.DataFrame(m.rows), pd.DataFrame(probe_rows)
    if args.skip_1b:  # keep the committed 1.1B rows
        table = keep_unmeasured_rows(table, args.out / "depth_benchmark.csv")
        probe = keep_unmeasured_rows(probe, args.out / "swap_probe_cost.csv")
    table.to_csv(args.out / "depth_benchmark.csv", index=False)
    probe.to_csv(args.out / "swap_probe_cost.csv", index=False)
    text = (f"# Depth scoring and recovery benchmark ({platform.processor() or platform.machine()}, "
            f"{torch.get_num_threads()} threads, fp32, CPU)\n\n"
            + table[["model", "stage", "what", "seconds", "rss_start_mb", "rss_peak_mb", "rss_increase_mb"]]
            .to_markdown(index=False, floatfmt=".2f")
            + "\n\nSwap-KL probe: cached dense prefixes vs one full forward pass per variant\n\n"
            + probe.to_markdown(index=False, floatfmt=".3f") + "\n")
    (args.out / "depth_benchmark.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
