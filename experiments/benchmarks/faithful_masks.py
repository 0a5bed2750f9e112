"""Benchmark: prunelab's magnitude, Wanda, SparseGPT and RIA masks against independent oracles.

Over all 30 decoder layers of SmolLM2-135M (fp32, CPU) with 32 x 256 tokens of real text
(`realtext`, seed 0), each method at 50% unstructured and 2:4 is run by prunelab (its defaults, and
the non-default switches that show why the defaults matter) and by the oracle in `tests/oracles`
(written from the papers' protocols, sharing no code with prunelab), each on its own copy of the
dense model with the same calibration token ids. A mask is a weight matrix's zero pattern; the table
counts the entries where the two differ, the layers where they do, and for SparseGPT the largest
|W_prunelab - W_oracle| of the pruned weights. The oracle is run once per method and sparsity and
compared with every prunelab setting.

    python experiments/benchmarks/faithful_masks.py --out results/benchmarks  # ~20 min, 1 thread
    python experiments/benchmarks/faithful_masks.py --render-only  # the markdown from the CSV

The CI counterpart on the first two layers is tests/test_faithful_references.py.

Below that table, the rows of the comparisons with the official code itself (RIA, DSnoT, ALPS,
DLP: each official repository run unedited with CPU shims, `official_*.py`) are gathered from
their CSVs, whole-model rows only (`official_ria.csv`, `official_dsnot.csv`,
`official_alps_all_layers.csv`, `official_dlp_masks.csv`): one place for every mask comparison.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from collections import defaultdict
from pathlib import Path

import pandas as pd
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))  # the `oracles` package

from oracles.compare import compare, load_smollm2, oracle_run, realtext_calibration  # noqa: E402

SPARSITY_TYPES = ("unstructured", "2:4")
SETTINGS = {  # prunelab switches per method; {} = the defaults
    "magnitude": [{}, {"ties": "exact", "rounding": "carry"}],  # the old default
    "wanda": [{}, {"norm_arithmetic": "sum_of_squares"}, {"ties": "reference"}],
    "sparsegpt": [{}, {"ties": "exact", "rounding": "carry"}],  # the old default
    "ria": [{}, {"group": "row", "ties": "exact"}],  # its --per_outneuron
}
COLUMNS = {"method": "method", "sparsity": "sparsity", "setting": "setting",
           "differing_entries": "differing entries", "total_entries": "total entries",
           "fraction": "fraction", "layers_with_differences": "layers with differences",
           "max_abs_dW": "max abs dW", "seconds_prunelab": "prunelab s",
           "seconds_oracle": "oracle s"}


def linears_with_differences(per_linear: dict[str, int]) -> str:
    """"down_proj:12 q_proj:3": differing entries summed over layers, per linear name."""
    totals: dict[str, int] = defaultdict(int)
    for key, count in per_linear.items():
        totals[key.split(".", 2)[2].rsplit(".", 1)[-1]] += count
    return " ".join(f"{name}:{count}" for name, count in sorted(totals.items()) if count) or "none"


OFFICIAL_CSVS = ("official_ria.csv", "official_dsnot.csv", "official_alps_all_layers.csv", "official_dlp_masks.csv")
OFFICIAL_COLUMNS = {"method": "method", "sparsity": "sparsity", "setting": "prunelab setting",
                    "official": "official arguments", "differing_entries": "differing entries",
                    "total_entries": "total entries", "layers_with_differences": "layers with differences",
                    "max_abs_dW": "max abs dW"}


def render_official(folder: Path) -> str:
    """The official-code comparisons' whole-model rows, from their CSVs in `folder`."""
    tables = [pd.read_csv(folder / name) for name in OFFICIAL_CSVS if (folder / name).exists()]
    if not tables:
        return ""
    shown = pd.concat(tables, ignore_index=True)[list(OFFICIAL_COLUMNS)].rename(columns=OFFICIAL_COLUMNS)
    for column in ("differing entries", "total entries"):
        shown[column] = shown[column].map(lambda n: f"{int(n):,}")
    shown["max abs dW"] = shown["max abs dW"].map(lambda v: "" if pd.isna(v) else f"{v:.3g}")
    markdown = shown.to_markdown(index=False, disable_numparse=True,
                                 colalign=["left"] * 4 + ["right"] * 2 + ["left", "right"])
    return ("\n## Against the official code (all 30 layers; from " + ", ".join(OFFICIAL_CSVS)
            + ")\n\nEach official repository run unedited on the same calibration (CPU shims: "
            "`experiments/benchmarks/official_*.py`); the per-method files give times, shims and partial-"
            "layer rows. DSnoT's swaps are counted in `official_dsnot.csv`; DLP's per-layer ratios in "
            "`official_dlp.md` (max abs difference 0). `max abs dW`: ALPS's weights after its "
            "post-processing (the others keep the dense values of what they keep).\n\n" + markdown + "\n")


def render(table: pd.DataFrame, header: str) -> str:
    """Markdown of the table, every number formatted here (tabulate would reformat them)."""
    shown = table[list(COLUMNS)].rename(columns=COLUMNS).copy()
    for column in ("differing entries", "total entries"):
        shown[column] = shown[column].map(lambda n: f"{int(n):,}")
    shown["fraction"] = shown["fraction"].map(lambda f: f"{f:.3g}")
    shown["max abs dW"] = shown["max abs dW"].map(lambda v: "" if pd.isna(v) else f"{v:.3g}")
    for column in ("prunelab s", "oracle s"):
        shown[column] = shown[column].map(lambda t: f"{t:.1f}")
    aligns = ["left"] * 3 + ["right"] * 3 + ["left"] + ["right"] * 3
    markdown = shown.to_markdown(index=False, disable_numparse=True, colalign=aligns)
    return header + "\n\n" + markdown + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("results/benchmarks"))
    parser.add_argument("--nsamples", type=int, default=32)
    parser.add_argument("--seqlen", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--methods", nargs="+", choices=list(SETTINGS), default=list(SETTINGS),
                        help="re-measure these methods; the other methods' rows are kept from the CSV")
    parser.add_argument("--render-only", action="store_true",
                        help="rewrite the markdown from the CSV")
    args = parser.parse_args()
    csv, md = args.out / "faithful_masks.csv", args.out / "faithful_masks.md"
    if args.render_only:
        table = pd.read_csv(csv)
        md.write_text(render(table, md.read_text().split("\n\n", 1)[0]) + render_official(args.out))
        print(md.read_text())
        return 0
    torch.set_num_threads(args.threads)
    loaded = load_smollm2()
    token_ids = realtext_calibration(loaded.tokenizer, args.nsamples, args.seqlen, seed=args.seed)
    cpu = platform.processor() or platform.machine()
    header = (f"# prunelab against the reference oracles: SmolLM2-135M, all "
              f"{loaded.adapter.num_layers} layers, realtext calibration {args.nsamples} x "
              f"{args.seqlen} tokens (seed {args.seed}); fp32, CPU ({cpu}), torch "
              f"{torch.__version__}, {args.threads} thread(s)")
    args.out.mkdir(parents=True, exist_ok=True)
    kept = pd.read_csv(csv) if csv.exists() and set(args.methods) != set(SETTINGS) else None
    kept = kept[~kept["method"].isin(args.methods)] if kept is not None else None
    rows = kept.to_dict("records") if kept is not None else []
    for method, settings in ((m, SETTINGS[m]) for m in args.methods):
        for sparsity_type in SPARSITY_TYPES:
            start = time.perf_counter()
            oracle = oracle_run(loaded, method, token_ids, 0.5, sparsity_type)
            seconds = time.perf_counter() - start
            print(f"oracle {method} {sparsity_type}: {seconds:.0f} s", flush=True)
            for switches in settings:
                result = compare(loaded, method, token_ids, 0.5, sparsity_type, switches,
                                 oracle=oracle)
                row = result.row()
                row["linears_with_differences"] = linears_with_differences(result.per_linear)
                rows.append(row)
                shown = ("method", "sparsity", "setting", "differing_entries",
                         "layers_with_differences", "max_abs_dW", "seconds_prunelab")
                print({k: row[k] for k in shown}, flush=True)
                order = list(SETTINGS)  # the table in method order whatever was re-measured
                table = pd.DataFrame(rows).sort_values("method", key=lambda c: c.map(order.index), kind="stable")
                table.to_csv(csv, index=False)
                md.write_text(render(table, header) + render_official(args.out))
            del oracle
    print(md.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
