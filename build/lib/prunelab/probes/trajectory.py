"""The swap-KL gap over a training trajectory: one probe per checkpoint.

For each revision (the testbed's `step*` subfolders, or Pythia hub revisions such as step1000 on a
GPU), the same calibration text is probed and the mean replacement-minus-interchange gap over all
probed pairs is reported; the paper sees it grow with training (Pythia-410M: +0.035 at step 0 to
+0.263 at step 143K).

    python -m prunelab.probes.trajectory --model testbed_pythia --out results/swap_protocols
    python -m prunelab.probes.trajectory --model EleutherAI/pythia-410m \
        --revisions step0,step1000,step16000,step64000,step143000 --source wikitext2 --device cuda
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

import pandas as pd

from prunelab.calibration import capture_layer_inputs
from prunelab.data import CalibrationSpec, TokenCache, calibration_samples
from prunelab.models import ModelSpec, load_model
from prunelab.models.spec import SHIPPED_ROOT
from prunelab.probes.swap import SwapProbe

log = logging.getLogger(__name__)


def local_revisions(model: str) -> list[str]:
    """Checkpoint subfolders of a shipped or local model, in training order."""
    root = SHIPPED_ROOT / model if (SHIPPED_ROOT / model).exists() else Path(model)
    names = [p.name for p in root.iterdir() if (p / "config.json").exists()]
    return sorted(names, key=lambda n: int("".join(c for c in n if c.isdigit()) or 0))


def probe_trajectory(model: str, revisions: list[str], calibration: CalibrationSpec, seed: int = 0,
                     max_distance: int = 3, reduce: str = "max", positions: str = "all",
                     device: str = "auto", cache_dir: Path | None = None) -> tuple[pd.DataFrame, dict]:
    rows, matrices = [], {}
    for revision in revisions:
        loaded = load_model(ModelSpec(name_or_path=model, revision=revision, device=device))
        samples = calibration_samples(calibration, loaded.tokenizer, seed,
                                      TokenCache(cache_dir / "tokens" if cache_dir else None))
        inputs = capture_layer_inputs(loaded.adapter, samples)
        result = SwapProbe(loaded.adapter, max_distance, reduce, positions).run(inputs)
        gap = result.gap()
        rows.append({"revision": revision, "mean_replacement": float(result.replacement[~result.replacement.isnan()].mean()),
                     "mean_interchange": float(result.interchange[~result.interchange.isnan()].mean()),
                     "mean_gap": float(gap.mean()), "gap_positive_fraction": float((gap > 0).float().mean()),
                     "pairs": len(result.pairs), "cost_ratio": result.cost.ratio})
        matrices[revision] = result.to_dict()
        log.info("%s: mean gap %.4f", revision, rows[-1]["mean_gap"])
    return pd.DataFrame(rows), matrices


def plot_trajectory(table: pd.DataFrame, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.2))
    ax.plot(table["revision"], table["mean_replacement"], marker="o", label="replacement")
    ax.plot(table["revision"], table["mean_interchange"], marker="s", label="interchange")
    ax.plot(table["revision"], table["mean_gap"], marker="^", label="gap (repl - int)")
    ax.set_xlabel("checkpoint")
    ax.set_ylabel("mean token KL")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m prunelab.probes.trajectory", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="testbed_pythia")
    parser.add_argument("--revisions", help="comma-separated; default: every local checkpoint")
    parser.add_argument("--source", default="testbed", help="calibration source (testbed, wikitext2, c4)")
    parser.add_argument("--nsamples", type=int, default=16)
    parser.add_argument("--seqlen", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-distance", type=int, default=3)
    parser.add_argument("--reduce", default="max", choices=("max", "mean", "forward"))
    parser.add_argument("--positions", default="all", choices=("all", "last"))
    parser.add_argument("--device", default="auto")
    parser.add_argument("--out", type=Path, default=Path("results/swap_protocols"))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    revisions = args.revisions.split(",") if args.revisions else local_revisions(args.model)
    calibration = CalibrationSpec(source=args.source, nsamples=args.nsamples, seqlen=args.seqlen)
    table, matrices = probe_trajectory(args.model, revisions, calibration, args.seed, args.max_distance,
                                       args.reduce, args.positions, args.device)
    args.out.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out / "trajectory.csv", index=False)
    (args.out / "trajectory.md").write_text(table.to_markdown(index=False, floatfmt=".4f") + "\n")
    (args.out / "trajectory_matrices.json").write_text(json.dumps(matrices))
    plot_trajectory(table, args.out / "trajectory.png")
    print(table.to_markdown(index=False, floatfmt=".4f"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
