"""Benchmark: prunelab's DLP allocation against the official DLP ratios on SmolLM2-135M, all 30 layers.

The official code (ironartisan/DLP, `lib/prune.py` `get_dlp_ratios`, with its `lib/layerwrapper.py`,
`lib/utils.py`, `lib/sparsegpt.py`, `lib/quant.py`) runs unedited from a temporary copy, with the
CPU shims of `official_code.py`, on the dense model; prunelab's `pruning/allocation=dlp` computes
its targets from `DenseStatistics` with the same calibration token ids (realtext, 32 x 256, seed 0;
fp32, CPU). The official layer sparsity is what `prune_wanda_dlp` uses: 1 - ratio, 0.01 where <= 0.
Per layer the table gives both and whether Wanda's per-row count int(in x s) agrees for every
input width of the layer (576 and 1536 on SmolLM2): equal counts mean equal Wanda-DLP masks, since
`pruning=wanda` itself gives the official Wanda masks.

    python experiments/benchmarks/official_dlp.py --dlp-repo /path/to/DLP/git --out results/benchmarks
    python experiments/benchmarks/official_dlp.py --dlp-repo /path/to/DLP/git --masks  # Wanda-DLP at 70%
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pandas as pd
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))  # the `oracles` package
sys.path.insert(0, str(Path(__file__).resolve().parent))

from official_code import comparison_header, comparison_parser  # noqa: E402
from official_runs import DLP_ALPHA as ALPHA  # noqa: E402
from official_runs import dlp_ratios, run_dlp  # noqa: E402
from oracles.compare import (  # noqa: E402
    compare_weights, layer_weights, load_smollm2, realtext_calibration, run_prunelab, with_model,
)

from prunelab.allocation.dlp import DLP  # noqa: E402
from prunelab.calibration.dense_statistics import DenseStatistics  # noqa: E402
from prunelab.context import PruneContext  # noqa: E402
from prunelab.pruning.wanda import Wanda  # noqa: E402

TARGETS = (0.7, 0.5)  # the README's 70%, and 50%


def official_sparsities(repo: Path, model, tokenizer, token_ids: torch.Tensor, target: float) -> list[float]:
    """The official get_dlp_ratios, turned into the layer sparsities prune_wanda_dlp prunes with."""
    ratios = dlp_ratios(repo, model, tokenizer, token_ids, f"--sparsity_ratio {target}")
    return [0.01 if 1 - r <= 0 else 1 - r for r in ratios]


def official_wanda_dlp(repo: Path, model, tokenizer, token_ids: torch.Tensor, target: float) -> None:
    """The README command (`--prune_method wanda_dlp --alpha 0.15`) on `model`, in place."""
    run_dlp(repo, model, tokenizer, token_ids, f"--prune_method wanda_dlp --sparsity_ratio {target}")


def measure_masks(repo: Path, nsamples: int, seqlen: int, target: float, csv: Path) -> None:
    """Wanda-DLP's masks, official against `pruning=wanda pruning/allocation=dlp`, all 30 layers."""
    loaded = load_smollm2()
    token_ids = realtext_calibration(loaded.tokenizer, nsamples, seqlen, seed=0)
    official = copy.deepcopy(loaded.model)
    official_wanda_dlp(repo, official, loaded.tokenizer, token_ids, target)
    ours = with_model(loaded, copy.deepcopy(loaded.model))
    run_prunelab(ours, Wanda(sparsity=target, allocation=DLP(alpha=ALPHA)), token_ids)
    result = compare_weights(layer_weights(ours.model), layer_weights(official), method="wanda+dlp",
                             sparsity=target, sparsity_type="unstructured",
                             setting="pruning=wanda pruning/allocation=dlp")
    pd.DataFrame([{**result.row(), "official": "--prune_method wanda_dlp --alpha 0.15"}]).to_csv(csv, index=False)
    print(f"wanda_dlp at {target}: {result.differing} of {result.entries} entries differ", flush=True)


def measure(repo: Path, nsamples: int, seqlen: int, csv: Path) -> pd.DataFrame:
    loaded = load_smollm2()
    token_ids = realtext_calibration(loaded.tokenizer, nsamples, seqlen, seed=0)
    widths = sorted({linear.in_features for linear in loaded.adapter.prunable_linears().values()})
    rows = []
    for target in TARGETS:
        official = official_sparsities(repo, loaded.model, loaded.tokenizer, token_ids, target)
        ours = DLP(alpha=ALPHA).allocate(target, DenseStatistics(PruneContext(loaded, 0, lambda: token_ids,
                                                                              progress=False)))
        for layer, (a, b) in enumerate(zip(ours, official, strict=True)):
            rows.append({"target": target, "layer": layer, "prunelab": a, "official": b, "abs_diff": abs(a - b),
                         "same_row_counts": all(int(w * a) == int(w * b) for w in widths)})
        print(f"target {target}: max |diff| {max(abs(a - b) for a, b in zip(ours, official)):.3g}", flush=True)
        pd.DataFrame(rows).to_csv(csv, index=False)
    return pd.DataFrame(rows)


def render(table: pd.DataFrame, header: str, masks: pd.DataFrame | None = None) -> str:
    summary = table.groupby("target").agg(layers=("layer", "count"), max_abs_diff=("abs_diff", "max"),
                                          layers_with_other_row_counts=("same_row_counts", lambda s: int((~s).sum())),
                                          min_prunelab=("prunelab", "min"), max_prunelab=("prunelab", "max"),
                                          mean_prunelab=("prunelab", "mean")).reset_index()
    per_layer = table.pivot(index="layer", columns="target", values=["prunelab", "official"])
    per_layer.columns = [f"{side} {target:g}" for side, target in per_layer.columns]
    per_layer = per_layer.reset_index().astype({"layer": str})
    mask_rows = "" if masks is None else (
        f"Wanda-DLP masks at {TARGETS[0]:.0%}, official `run.py --prune_method wanda_dlp --alpha 0.15` against "
        "`pruning=wanda pruning/allocation=dlp`:\n\n" + masks[["official", "setting", "differing_entries",
                                                         "total_entries", "layers_with_differences",
                                                         "pruned_prunelab", "pruned_oracle"]]
        .rename(columns={"pruned_oracle": "pruned_official"}).to_markdown(index=False) + "\n\n")
    return (f"# {header}\n\n{summary.to_markdown(index=False, floatfmt='.9g')}\n\n{mask_rows}"
            f"Per layer (sparsity):\n\n{per_layer.to_markdown(index=False, floatfmt='.9f')}\n\n{NOTES}")


NOTES = """How to read it: `official` is 1 - the ratio `get_dlp_ratios` returns (0.01 where <= 0), what
`prune_wanda_dlp` prunes each layer to; `prunelab` is `pruning/allocation=dlp` (alpha 0.15) from
the same calibration. `layers_with_other_row_counts` counts layers where Wanda's per-row count
int(in x s) differs for some input width of the layer; 0 means the Wanda-DLP masks are the same.
"""


def main() -> None:
    parser = comparison_parser(__doc__.splitlines()[0], "--dlp-repo")
    parser.add_argument("--masks", action="store_true", help="also compare Wanda-DLP's masks at 70%%")
    args = parser.parse_args()
    csv, masks_csv = args.out / "official_dlp.csv", args.out / "official_dlp_masks.csv"
    header = comparison_header("prunelab's DLP allocation against the official ratios", args, f", alpha {ALPHA}")
    if not args.render_only:
        torch.set_num_threads(args.threads)
        if args.masks:
            measure_masks(args.dlp_repo, args.nsamples, args.seqlen, TARGETS[0], masks_csv)
        else:
            measure(args.dlp_repo, args.nsamples, args.seqlen, csv)
    masks = pd.read_csv(masks_csv) if masks_csv.exists() else None
    (args.out / "official_dlp.md").write_text(render(pd.read_csv(csv), header, masks))
    print((args.out / "official_dlp.md").read_text())


if __name__ == "__main__":
    main()
