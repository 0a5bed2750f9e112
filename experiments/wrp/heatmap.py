"""All-pairs WRP similarity heatmaps (forward-free: weights only) of model presets.

    python experiments/wrp/heatmap.py --out results/wrp                       # the testbed models
    python experiments/wrp/heatmap.py --models smollm2_135m --out results/wrp/smollm2
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from prunelab.analysis.plots import plot_matrix, save_figure
from prunelab.context import PruneContext
from prunelab.cli import model_preset
from prunelab.models import load_model
from prunelab.pruning.scorers.base import ScoreRequest
from prunelab.pruning.scorers.wrp import WeightRedundancy


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("results/wrp"))
    parser.add_argument("--models", default="testbed_llama,testbed_pythia")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.models.split(","):
        loaded = load_model(model_preset(name, device="cpu"))
        ctx = PruneContext(loaded, seed=0, calibration=lambda: None, progress=False)
        for form in ("gram", "raw"):
            scores = WeightRedundancy(form).score(ctx, ScoreRequest(loaded.adapter.num_layers, 0))
            figure = plot_matrix(scores.pairwise, f"WRP {form} similarity, {name}")
            save_figure(figure, args.out / f"wrp_similarity_{name}_{form}.png")
            (args.out / f"wrp_similarity_{name}_{form}.json").write_text(json.dumps(scores.pairwise))
            rounded = [round(v, 3) for v in scores.per_layer]
            print(f"{name} {form}: per-layer score (1 - max similarity to another layer) {rounded}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
