"""How far a measured speedup can be trusted: removing k of SmolLM2-135M's 30 layers, the measured
prefill and decode speedups against what the FLOP ratio alone would give, and the spread of the
same measurement repeated.

For each k the evaluator (`prunelab.evaluation.efficiency`) measures the dense model against a copy
with k layers removed (evenly spaced, never the first), `--sessions` times; k = 0 times the dense
model against an identical copy, so its speedups are the measurement's own noise. The FLOP
speedup is 1 / (pruned FLOPs / dense FLOPs) from PyTorch's counter. Writes
efficiency_benchmark.md and .csv to --out.

    python experiments/benchmarks/efficiency_benchmark.py --out results/benchmarks
"""

from __future__ import annotations

import argparse
import copy
import logging
import statistics
from pathlib import Path

import pandas as pd
import torch

from prunelab.config import model_preset
from prunelab.evaluation.cost import count_cost
from prunelab.evaluation.efficiency import EfficiencyMeasurement, EfficiencySpec
from prunelab.models import ModelAdapter, load_model

log = logging.getLogger("efficiency_benchmark")


def spaced_layers(num_layers: int, k: int) -> list[int]:
    """k layer indices spread evenly over 1..num_layers-1 (layer 0 is kept, as depth studies do)."""
    return sorted({1 + round(i * (num_layers - 2) / max(k - 1, 1)) for i in range(k)}) if k else []


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2_135m")
    parser.add_argument("--removed", type=int, nargs="+", default=[0, 3, 6, 9, 12, 15])
    parser.add_argument("--sessions", type=int, default=3, help="measurements of each k")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("results/benchmarks"))
    parser.add_argument("--machine", default="2-core shared machine")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")

    loaded = load_model(model_preset(args.model, device="cpu"), cache_dir=Path.home() / ".cache" / "prunelab")
    dense = loaded.model.eval()
    spec = EfficiencySpec(measure="always", repeats=args.repeats, threads=args.threads)
    dense_cost = count_cost(dense, spec.decode_context)
    rows = []
    for k in args.removed:
        pruned = copy.deepcopy(dense)
        removed = spaced_layers(loaded.adapter.num_layers, k)
        if removed:
            ModelAdapter(pruned).remove_layers(removed)
        for session in range(args.sessions):
            section = EfficiencyMeasurement(spec, torch.device("cpu"), None, dense_cost).measure(dense, pruned)
            flops = section["counted"]["ratio"]["flops_prefill"]
            grid = section["prefill"]
            rows.append({
                "layers_removed": k, "session": session, "flops_ratio": flops, "flops_speedup": 1 / flops,
                "decode_flops_speedup": 1 / section["counted"]["ratio"]["flops_decode"],
                "prefill_speedup": section["speedup"]["prefill"], "decode_speedup": section["speedup"]["decode"],
                "prefill_ratio_q25": min(p["ratio_q25"] for p in grid), "prefill_ratio_q75": max(p["ratio_q75"] for p in grid),
                "decode_ratio_q25": section["decode"]["ratio_q25"], "decode_ratio_q75": section["decode"]["ratio_q75"],
                "dense_prefill_ms": 1000 * statistics.median(p["dense"]["median_s"] for p in grid),
                "dense_decode_tok_s": section["decode"]["dense"]["tokens_per_s"],
            })
            log.info("k=%d session %d: prefill %.3fx decode %.3fx (FLOPs %.3fx)", k, session,
                     rows[-1]["prefill_speedup"], rows[-1]["decode_speedup"], 1 / flops)
        del pruned
    frame = pd.DataFrame(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    frame.to_csv(args.out / "efficiency_benchmark.csv", index=False)
    write_markdown(frame, args, spec, args.out / "efficiency_benchmark.md")


def write_markdown(frame: pd.DataFrame, args, spec: EfficiencySpec, path: Path) -> None:
    by_k = frame.groupby("layers_removed")
    table = pd.DataFrame({
        "FLOP speedup": by_k["flops_speedup"].first(),
        "prefill speedup (median of sessions)": by_k["prefill_speedup"].median(),
        "prefill, sessions min-max": by_k["prefill_speedup"].agg(lambda s: f"{s.min():.3f}-{s.max():.3f}"),
        "prefill / FLOP": by_k["prefill_speedup"].median() / by_k["flops_speedup"].first(),
        "decode speedup (median of sessions)": by_k["decode_speedup"].median(),
        "decode, sessions min-max": by_k["decode_speedup"].agg(lambda s: f"{s.min():.3f}-{s.max():.3f}"),
        "decode / FLOP": by_k["decode_speedup"].median() / by_k["decode_flops_speedup"].first(),
    }).reset_index()
    lines = [
        f"# Measured speedup against the FLOP ratio: {args.model}, CPU, {args.threads} thread(s), {args.machine}",
        "",
        f"Prefill grid {list(spec.prefill_grid)} (batch, tokens), decode {spec.new_tokens} tokens after "
        f"{spec.decode_context}; {args.repeats} repeats alternated dense/pruned after {spec.warmup} warm-up; "
        f"{args.sessions} sessions per k. k = 0 measures the dense model against an identical copy: "
        "its spread is the measurement's own noise. Made by `experiments/benchmarks/efficiency_benchmark.py`.",
        "",
        table.to_markdown(index=False, floatfmt=".3f"),
        "",
    ]
    path.write_text("\n".join(lines), encoding="utf-8")


if __name__ == "__main__":
    main()
