"""Benchmark: prunelab's ALPS against the official ALPS code on SmolLM2-135M, all 30 layers.

The official code (mazumder-lab/ALPS, `llama.py` `llama_sequential` with its `alps.py` and
`modelutils.py`) runs unedited from a temporary copy, with the CPU shims of `official_code.py`
(and `torch.cuda.synchronize` a no-op: `alps.py` calls it after every solve), on one deep copy of
the dense model; prunelab's `pruning=alps` on another, with the same calibration token ids
(realtext, 32 x 256, seed 0; fp32, CPU). The table counts the mask entries where the two differ and
gives the largest difference of a pruned weight.

    python experiments/benchmarks/official_alps.py --alps-repo /path/to/ALPS/git --out results/benchmarks
    python experiments/benchmarks/official_alps.py --render-only --out results/benchmarks

The CI counterpart (an oracle written from the paper, on the testbed) is tests/test_alps.py.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pandas as pd
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))  # the `oracles` package
sys.path.insert(0, str(Path(__file__).resolve().parent))

from official_code import comparison_header, comparison_parser, render_mask_table  # noqa: E402
from official_runs import run_alps  # noqa: E402
from oracles.compare import (  # noqa: E402
    compare_weights, layer_weights, load_smollm2, realtext_calibration, run_prunelab, truncated, with_model,
)

from prunelab.pruning.alps import ALPS  # noqa: E402

#: (official arguments: sparsity, nm_n, nm_m; prunelab settings)
SETTINGS = [
    ((0.7, 0, 0), {"sparsity": 0.7}),
    ((0.5, 0, 0), {"sparsity": 0.5}),
    ((0.5, 2, 4), {"sparsity": 0.5, "sparsity_type": "2:4"}),
]
COLUMNS = {"official": "official arguments", "setting": "prunelab", "differing_entries": "differing entries",
           "total_entries": "total entries", "layers_with_differences": "layers with differences",
           "max_abs_dW": "max abs dW", "pruned_prunelab": "pruned (prunelab)", "pruned_oracle": "pruned (official)",
           "seconds_prunelab": "prunelab s", "seconds_oracle": "official s"}


def measure(repo: Path, settings: list, nsamples: int, seqlen: int, layers: int | None = None) -> pd.DataFrame:
    loaded = load_smollm2()
    if layers is not None:  # the first `layers` decoder layers only (a shorter check)
        loaded = truncated(loaded, layers)
    token_ids = realtext_calibration(loaded.tokenizer, nsamples, seqlen, seed=0)
    rows = []
    for (sparsity, nm_n, nm_m), prunelab_settings in settings:
        official = copy.deepcopy(loaded.model)
        seconds_official = run_alps(repo, official, None, token_ids, f"sp={sparsity} --nm_n {nm_n} --nm_m {nm_m}")
        official_weights = layer_weights(official)
        del official
        ours = with_model(loaded, copy.deepcopy(loaded.model))
        seconds = run_prunelab(ours, ALPS(**prunelab_settings), token_ids)
        setting = " ".join(f"{k}={v}" for k, v in prunelab_settings.items())
        sparsity_type = prunelab_settings.get("sparsity_type", "unstructured")
        result = compare_weights(layer_weights(ours.model), official_weights, method="alps", sparsity=sparsity,
                                 sparsity_type=sparsity_type, setting=setting,
                                 seconds_prunelab=seconds, seconds_oracle=seconds_official)
        del ours
        official_args = f"sp={sparsity} --nm_n {nm_n} --nm_m {nm_m}"
        rows.append({**result.row(), "max_abs_dW": result.max_abs_weight_diff, "official": official_args,
                     "setting": setting})
        print(f"{official_args}: {result.differing} of {result.entries} entries differ, max |dW| "
              f"{result.max_abs_weight_diff:.3g} ({seconds:.0f} s prunelab, {seconds_official:.0f} s official)",
              flush=True)
    return pd.DataFrame(rows)


NOTES = """How to read it: every linear weight of the layers named in the title is compared (SmolLM2-135M's
30 layers hold 106,168,320 entries, its first 4 14,155,776); `differing entries` counts those pruned by one side only, `max abs dW` is the largest
difference between the two sides' weights (ALPS re-fits every kept weight). The official run is the
repository's own `llama_sequential`, unedited (shims only: `experiments/benchmarks/official_code.py`),
with rho 0.1 as that function hard-codes it; the prunelab run is `pruning=alps` with the settings shown.
"""


def main() -> None:
    parser = comparison_parser(__doc__.splitlines()[0], "--alps-repo")
    parser.add_argument("--settings", default=",".join(map(str, range(len(SETTINGS)))),
                        help="indices of SETTINGS to run, comma-separated (all by default)")
    parser.add_argument("--layers", type=int, default=None, help="compare the first N decoder layers only")
    args = parser.parse_args()
    csv = args.out / "official_alps.csv"
    header = comparison_header("prunelab's ALPS against the official code", args)
    if args.layers:
        header = header.replace("all 30 layers", f"the first {args.layers} of 30 layers")
    if not args.render_only:
        torch.set_num_threads(args.threads)
        chosen = [SETTINGS[int(i)] for i in args.settings.split(",")]
        measure(args.alps_repo, chosen, args.nsamples, args.seqlen, args.layers).to_csv(csv, index=False)
    table = pd.read_csv(csv)
    table["max_abs_dW"] = table["max_abs_dW"].map(lambda d: f"{d:.3g}")
    (args.out / "official_alps.md").write_text(render_mask_table(table, COLUMNS, header, NOTES))
    print((args.out / "official_alps.md").read_text())


if __name__ == "__main__":
    main()
