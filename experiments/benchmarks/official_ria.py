"""Benchmark: prunelab's RIA against the official RIA code on SmolLM2-135M, all 30 layers.

The official code (biomedical-cybernetics/Relative-importance-and-activation-pruning,
`lib/prune.py` `prune_ria`, with its `lib/layerwrapper.py`, `lib/sparsegpt.py`, `lib/quant.py`)
runs unedited from a temporary copy, with the CPU shims of `official_code.py`, on one deep copy of
the dense model; prunelab's `pruning=ria` on another, with the same calibration token ids (realtext,
32 x 256, seed 0; fp32, CPU). Each setting is the official command line and the prunelab switches
that claim to reproduce it; the table counts the mask entries where the two differ.

    python experiments/benchmarks/official_ria.py --ria-repo /path/to/ria/git --out results/benchmarks
    python experiments/benchmarks/official_ria.py --render-only --out results/benchmarks

The CI counterpart (an oracle written from the paper, first layers) is in
tests/test_faithful_references.py.
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
from official_runs import run_ria  # noqa: E402
from oracles.compare import (  # noqa: E402
    compare_weights, layer_weights, load_smollm2, realtext_calibration, run_prunelab, with_model,
)

from prunelab.pruning.ria import RIA  # noqa: E402

#: (official command-line switches, prunelab settings)
SETTINGS = [
    ("--sparsity_type unstructured", {"sparsity_type": "unstructured"}),
    ("--sparsity_type 2:4", {"sparsity_type": "2:4"}),
    ("--sparsity_type 2:4 --reallocation", {"sparsity_type": "2:4", "permutation": "heuristic"}),
    ("--sparsity_type 2:4 --reallocation --lsa --fast", {"sparsity_type": "2:4", "permutation": "lsa",
                                                         "lsa_fast": True}),
    ("--sparsity_type 2:4 --reallocation --lsa", {"sparsity_type": "2:4", "permutation": "lsa"}),
]
COLUMNS = {"official": "official switches", "setting": "prunelab", "differing_entries": "differing entries",
           "total_entries": "total entries", "layers_with_differences": "layers with differences",
           "pruned_prunelab": "pruned (prunelab)", "pruned_oracle": "pruned (official)",
           "seconds_prunelab": "prunelab s", "seconds_oracle": "official s"}


def measure(repo: Path, settings: list, nsamples: int, seqlen: int) -> pd.DataFrame:
    loaded = load_smollm2()
    token_ids = realtext_calibration(loaded.tokenizer, nsamples, seqlen, seed=0)
    rows = []
    for switches, prunelab_settings in settings:
        official = copy.deepcopy(loaded.model)
        seconds_official = run_ria(repo, official, loaded.tokenizer, token_ids, switches)
        official_weights = layer_weights(official)
        del official
        ours = with_model(loaded, copy.deepcopy(loaded.model))
        seconds = run_prunelab(ours, RIA(**prunelab_settings), token_ids)
        setting = " ".join(f"{k}={v}" for k, v in prunelab_settings.items())
        result = compare_weights(layer_weights(ours.model), official_weights, method="ria", sparsity=0.5,
                                 sparsity_type=prunelab_settings["sparsity_type"], setting=setting,
                                 seconds_prunelab=seconds, seconds_oracle=seconds_official)
        del ours
        rows.append({**result.row(), "official": switches, "setting": setting})
        print(f"{switches}: {result.differing} of {result.entries} entries differ "
              f"({seconds:.0f} s prunelab, {seconds_official:.0f} s official)", flush=True)
    return pd.DataFrame(rows)


NOTES = """How to read it: every linear weight of SmolLM2-135M's 30 decoder layers (106,168,320 entries)
is compared; `differing entries` counts those pruned by one side only. The official run is the
repository's own `prune_ria`, unedited (shims only: `experiments/benchmarks/official_code.py`),
with its command-line defaults (`--a 0.5`, `--importance_score sum`, no `--per_outneuron`); the
prunelab run is `pruning=ria` with the settings shown. The `--reallocation` masks are 2:4 in the
permuted channel order only, on both sides (the official code maps the permuted mask back onto the
stored weights, as prunelab does).
"""


def main() -> None:
    parser = comparison_parser(__doc__.splitlines()[0], "--ria-repo")
    parser.add_argument("--quick", action="store_true", help="skip the full (unblocked) assignment")
    args = parser.parse_args()
    csv = args.out / "official_ria.csv"
    header = comparison_header("prunelab's RIA against the official code", args)
    if not args.render_only:
        torch.set_num_threads(args.threads)
        settings = SETTINGS[:-1] if args.quick else SETTINGS
        measure(args.ria_repo, settings, args.nsamples, args.seqlen).to_csv(csv, index=False)
    (args.out / "official_ria.md").write_text(render_mask_table(pd.read_csv(csv), COLUMNS, header, NOTES))
    print((args.out / "official_ria.md").read_text())


if __name__ == "__main__":
    main()
