"""Benchmark: prunelab's FLAP, Wanda-sp and magnitude-sp against the official FLAP code.

The official code (CASIA-IVA-Lab/FLAP `lib/prune.py`: prune_flap, prune_wanda_sp,
prune_magnitude_sp) is multi-head only and written for CUDA, float16 and transformers 4. It runs
through `official_runs.run_flap` (prunelab-free, shared with `user_conditions.py`): a temporary copy
of `lib/prune.py` and `lib/layerwrapper.py` (read from the fetched mirror with `git show`, never
edited) with these shims, all outside its files:
- `lib.data.get_loaders` is a stub module returning prunelab's calibration token ids;
- `torch.cuda.empty_cache` is a no-op and `Tensor.cuda` the identity (CPU build);
- each decoder layer gets a forward pre-hook computing `position_embeddings` from the model's
  rotary embedding (transformers 5 layers need it; the official loop passes position ids only),
  and each attention a `num_heads` attribute (its own modeling file had one);
- the head size 128 it hard-codes (`reshape(-1, 128)`, `repeat_interleave(128)`) is replaced by the
  model's head size: `Tensor.reshape` and `Tensor.repeat_interleave` called from `lib/prune.py`
  itself (and from nowhere else) see 64 for 128;
- as its `get_llm`, a zero bias is added to o_proj and down_proj of every layer, and
  `model.seqlen = 128` (its main.py).
Both sides run on SmolLM2-135M's exact multi-head rewrite (`models.width.to_multi_head`: each
key/value head repeated for its 3 query heads, identical logits), in float16 as the official run
(its compensation bias multiplies float16 means by the weights and fails on a float32 model), on
the CPU, with the same realtext calibration token ids (seqlen 128, the official `main.py`'s),
prunelab with its defaults for `pruning=flap`, `wanda_sp`, `magnitude_sp` at ratio 0.2 (the
official published setting: WIFV, AL-AM, bias). The kept heads and channels are read back from
the pruned weights (each kept row of q_proj and gate_proj matched to its dense row), and the
largest |difference| of every pruned weight and bias is reported.

    python experiments/benchmarks/faithful_width.py --flap-repo /path/to/FLAP/git  # ~15 min, 2 threads
    python experiments/benchmarks/faithful_width.py --render-only

The CI counterpart (an independent oracle on the first layers) is tests/test_faithful_width.py.
"""

from __future__ import annotations

import argparse
import copy
import platform
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))  # the `oracles` package

from oracles.compare import load_smollm2, realtext_calibration  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from official_code import differing, kept_units  # noqa: E402
from official_runs import run_flap  # noqa: E402

import prunelab  # noqa: E402
from prunelab.models.adapter import ModelAdapter  # noqa: E402
from prunelab.models.width import to_multi_head  # noqa: E402

METHODS = {"flap": "flap", "wanda_sp": "wanda_sp", "magnitude_sp": "mag_sp"}  # prunelab -> official
COLUMNS = {"method": "method", "official": "official", "ratio": "ratio", "heads_kept": "heads kept",
           "channels_kept": "channels kept", "differing_heads": "differing heads",
           "differing_channels": "differing channels", "max_abs_dW": "max abs dW",
           "max_abs_dbias": "max abs dbias", "max_abs_bias": "max abs bias", "params_removed": "params removed",
           "seconds_prunelab": "prunelab s", "seconds_official": "official s"}


def flap_switches(method: str, ratio: float) -> str:
    """main.py's switches for the official method name `method` at `ratio`, as scripts/llama_7b.sh
    gives them (`--remove_heads -1`; WIFV and AL-AM, unused by wanda_sp and mag_sp)."""
    return f"--prune_method {method} --pruning_ratio {ratio} --remove_heads -1 --metrics WIFV --structure AL-AM"


def largest_differences(ours, official) -> tuple[float, float]:
    """(max |dW| over every weight, max |dbias| over o_proj/down_proj; a missing bias is zero);
    inf when shapes differ."""
    weights = biases = 0.0
    for a, b in zip(ours.model.layers, official.model.layers):
        for name, linear in a.named_modules():
            if not isinstance(linear, torch.nn.Linear):
                continue
            other = b.get_submodule(name)
            if linear.weight.shape != other.weight.shape:
                return float("inf"), float("inf")
            weights = max(weights, (linear.weight.float() - other.weight.float()).abs().max().item())
            mine = linear.bias if linear.bias is not None else torch.zeros(linear.out_features)
            theirs = other.bias if other.bias is not None else torch.zeros(linear.out_features)
            biases = max(biases, (mine.float() - theirs.float()).abs().max().item())
    return weights, biases


def largest_bias(model) -> float:
    """The largest |bias| of o_proj and down_proj (FLAP's compensation; zeros otherwise)."""
    return max(linear.bias.abs().max().item() for layer in model.model.layers
               for linear in (layer.self_attn.o_proj, layer.mlp.down_proj) if linear.bias is not None)


NOTES = """How to read it: the multi-head rewrite has 9 heads in each of 30 layers (270) and 1,536 MLP
channels in each (46,080). `differing heads` / `differing channels`: units kept by one side only,
summed over layers. `max abs dW` / `max abs dbias`: the largest difference of any weight or bias
after pruning (shapes must match first); 0 means bit-identical, so no float tolerance is needed:
both sides run the same float16 kernels in the same order, and the compensation bias is the
float16-rounded mean times the float16 weights on both. `max abs bias`: the largest compensation
bias the official code wrote (FLAP's are non-zero, so the bias comparison is a real one; Wanda-sp
and magnitude-sp add none: the official side's are the zero biases its `get_llm` adds).
`params removed`: the fraction of the rewrite's parameters that went, which is not the ratio:
AL-AM costs a head 170 channels whatever its size (about 24% of the layers' parameters at 0.2 on
64-dim heads), Wanda-sp and magnitude-sp remove int(0.2 x 9) = 1 head and int(0.2 x 1536) = 307
channels per layer. Times are CPU float16 on a shared machine, not a speed comparison.
"""


def width_comparison_parser(description: str, nsamples: int, seqlen: int, ratio: float) -> argparse.ArgumentParser:
    """The options of a width method's official-code comparison: where the table goes, the
    calibration (its size and seed), the ratio, torch threads, and rendering the CSV only."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("results/benchmarks"))
    parser.add_argument("--nsamples", type=int, default=nsamples)
    parser.add_argument("--seqlen", type=int, default=seqlen)
    parser.add_argument("--ratio", type=float, default=ratio)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--render-only", action="store_true", help="rewrite the markdown from the CSV")
    return parser


def multi_head_setup(args, repo: Path, dtype: torch.dtype):
    """(tokenizer, SmolLM2-135M's exact multi-head rewrite in `dtype`, the calibration ids from
    `args`, the official repository's commit) for a width method's official-code comparison."""
    loaded = load_smollm2()
    dense = loaded.model.to(dtype).eval()
    to_multi_head(ModelAdapter(dense))
    token_ids = realtext_calibration(loaded.tokenizer, args.nsamples, args.seqlen, seed=args.seed)
    commit = subprocess.run(["git", "--git-dir", str(repo), "rev-parse", "HEAD"], check=True,
                            capture_output=True, text=True).stdout.strip()
    return loaded.tokenizer, dense, token_ids, commit


def width_table_markdown(table: pd.DataFrame, columns: dict[str, str], differences: tuple[str, ...]) -> str:
    """A width comparison's rows as markdown: `differences` (weights, biases) to 3 significant
    digits, the fraction of parameters removed to 4 decimals, seconds whole."""
    shown = table[list(columns)].rename(columns=columns).copy()
    for column in differences:
        shown[column] = shown[column].map(lambda v: f"{v:.3g}")
    shown["params removed"] = shown["params removed"].map(lambda v: f"{v:.4f}")
    for column in ("prunelab s", "official s"):
        shown[column] = shown[column].map(lambda t: f"{t:.0f}")
    return shown.to_markdown(index=False, disable_numparse=True)


def render(table: pd.DataFrame, header: str) -> str:
    markdown = width_table_markdown(table, COLUMNS, ("max abs dW", "max abs dbias", "max abs bias"))
    return header + "\n\n" + markdown + "\n\n" + NOTES


def main() -> int:
    parser = width_comparison_parser(__doc__, nsamples=16, seqlen=128, ratio=0.2)
    parser.add_argument("--flap-repo", type=Path, default=Path("/work/.mirror/CASIA-IVA-Lab+FLAP/repo"),
                        help="git directory of CASIA-IVA-Lab/FLAP")
    parser.add_argument("--methods", nargs="+", choices=list(METHODS), default=list(METHODS),
                        help="re-measure these methods; the other methods' rows are kept from the CSV")
    args = parser.parse_args()
    csv, md = args.out / "faithful_width.csv", args.out / "faithful_width.md"
    if args.render_only:
        md.write_text(render(pd.read_csv(csv), md.read_text().split("\n\n", 1)[0]))
        print(md.read_text())
        return 0
    torch.set_num_threads(args.threads)
    tokenizer, dense, token_ids, commit = multi_head_setup(args, args.flap_repo, torch.float16)
    head_dim = dense.model.layers[0].self_attn.head_dim
    header = (f"# prunelab against the official FLAP code ({commit[:7]}): SmolLM2-135M's multi-head "
              f"rewrite, all {len(dense.model.layers)} layers, realtext calibration {args.nsamples} x "
              f"{args.seqlen} tokens (seed {args.seed}), ratio {args.ratio}; float16, CPU "
              f"({platform.processor() or platform.machine()}), torch {torch.__version__}, {args.threads} thread(s)")
    args.out.mkdir(parents=True, exist_ok=True)
    kept = pd.read_csv(csv) if csv.exists() and set(args.methods) != set(METHODS) else None
    rows = kept[~kept["method"].isin(args.methods)].to_dict("records") if kept is not None else []
    for method in args.methods:
        ours = copy.deepcopy(dense)
        start = time.perf_counter()
        report = prunelab.prune(ours, tokenizer, method=method, calibration=token_ids, ratio=args.ratio,
                                progress=False)
        seconds_ours = time.perf_counter() - start
        theirs = copy.deepcopy(dense)
        seconds_theirs = run_flap(args.flap_repo, theirs, tokenizer, token_ids, flap_switches(METHODS[method], args.ratio))
        heads, channels = kept_units(ours, dense, head_dim)
        their_heads, their_channels = kept_units(theirs, dense, head_dim)
        dw, db = largest_differences(ours, theirs)
        rows.append({"method": method, "official": METHODS[method], "ratio": args.ratio,
                     "heads_kept": sum(map(len, heads)), "channels_kept": sum(map(len, channels)),
                     "differing_heads": differing(heads, their_heads),
                     "differing_channels": differing(channels, their_channels),
                     "max_abs_dW": dw, "max_abs_dbias": db, "max_abs_bias": largest_bias(theirs),
                     "params_removed": report["pruning"]["width"]["params_removed"],
                     "seconds_prunelab": seconds_ours, "seconds_official": seconds_theirs})
        print(rows[-1], flush=True)
        del ours, theirs
        order = list(METHODS)  # the table in method order whatever was re-measured
        table = pd.DataFrame(rows).sort_values("method", key=lambda c: c.map(order.index), kind="stable")
        table.to_csv(csv, index=False)
        md.write_text(render(table, header))
    print(md.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
