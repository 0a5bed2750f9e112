"""Benchmark: the parameter budget of width pruning on SmolLM2-135M as it is (grouped-query).

Each width method is run by prunelab on the model as shipped (9 query heads over 3 key/value
heads: a pruned unit is a key/value head with its 3 query heads, the documented extension) at the
reference's `ratio: 0.2` and at `params_removed` 0.1, 0.2 and 0.3 (the fraction of the model's
parameters, embeddings included, to remove); the table gives the achieved fraction (it must be
within 0.01 of the target), the key/value heads and MLP channels kept, and the realtext token
perplexity (16 windows of 512 tokens, the real-model protocol without its zero-shot tasks).

    python experiments/benchmarks/width_budget.py --out results/benchmarks  # ~20 min, 2 threads
"""

from __future__ import annotations

import argparse
import copy
import platform
import sys
import time
from pathlib import Path

import pandas as pd
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))  # the `oracles` package

from oracles.compare import load_smollm2, realtext_calibration  # noqa: E402

import prunelab  # noqa: E402

METHODS = ("flap", "wanda_sp", "magnitude_sp")
SETTINGS = ({"ratio": 0.2}, {"params_removed": 0.1}, {"params_removed": 0.2}, {"params_removed": 0.3})


def perplexity(model, tokenizer) -> float:
    metrics = prunelab.evaluate(model, tokenizer, data="realtext", evaluation="realtext", progress=False,
                                overrides=["evaluation.zeroshot=null"])
    return metrics["ppl/realtext/token"]["value"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("results/benchmarks"))
    parser.add_argument("--nsamples", type=int, default=16)
    parser.add_argument("--seqlen", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    loaded = load_smollm2()
    dense, tokenizer = loaded.model.eval(), loaded.tokenizer
    token_ids = realtext_calibration(tokenizer, args.nsamples, args.seqlen, seed=0)
    rows = [{"method": "dense", "setting": "", "target": None, "params_removed": 0.0,
             "parameters": sum(p.numel() for p in dense.parameters()), "kv_heads_kept": 90,
             "channels_kept": 46080, "ppl": perplexity(dense, tokenizer), "seconds": 0.0}]
    print(rows[-1], flush=True)
    for method in METHODS:
        for setting in SETTINGS:
            model = copy.deepcopy(dense)
            start = time.perf_counter()
            report = prunelab.prune(model, tokenizer, method=method, calibration=token_ids, progress=False,
                                    **setting)
            seconds = time.perf_counter() - start
            width = report["pruning"]["width"]
            rows.append({"method": method, "setting": " ".join(f"{k}={v}" for k, v in setting.items()),
                         "target": setting.get("params_removed"), "params_removed": width["params_removed"],
                         "parameters": width["parameters_after"],
                         "kv_heads_kept": sum(layer["num_kv_heads"] for layer in width["per_layer"]),
                         "channels_kept": sum(layer["intermediate_size"] for layer in width["per_layer"]),
                         "ppl": perplexity(model, tokenizer), "seconds": seconds})
            print(rows[-1], flush=True)
            del model
    table = pd.DataFrame(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out / "width_budget.csv", index=False)
    shown = table.copy()
    shown["target"] = shown["target"].map(lambda v: "" if pd.isna(v) else f"{v:.2f}")
    shown["params_removed"] = shown["params_removed"].map(lambda v: f"{v:.4f}")
    shown["parameters"] = shown["parameters"].map(lambda n: f"{int(n):,}")
    shown["ppl"] = shown["ppl"].map(lambda v: f"{v:.2f}")
    shown["seconds"] = shown["seconds"].map(lambda v: f"{v:.0f}")
    header = (f"# Width pruning at a parameter budget: SmolLM2-135M (grouped-query, fp32), realtext calibration "
              f"{args.nsamples} x {args.seqlen} tokens (seed 0), token perplexity on 16 x 512 held-out realtext "
              f"tokens; CPU ({platform.processor() or platform.machine()}), torch {torch.__version__}, "
              f"{args.threads} thread(s)")
    notes = ("Dense: 30 layers of 3 key/value heads (90) and 1,536 channels (46,080). `params_removed`: "
             "1 - pruned / dense parameters of the whole model (tied embeddings once; FLAP's added biases "
             "count). At `ratio=0.2` the references' counting applies (FLAP: a key/value group of 3 "
             "query heads costs int(3 x 512/3) = 512 channels; Wanda-sp and magnitude-sp: int(0.2 x 3) = 0 "
             "groups, so only channels go). Magnitude-sp's perplexities are not a bug of the cut (Wanda-sp "
             "removes as many channels at 44): ranking channels by their down_proj column norms alone "
             "removes channels SmolLM2 needs.")
    text = header + "\n\n" + shown.to_markdown(index=False, disable_numparse=True) + "\n\n" + notes + "\n"
    (args.out / "width_budget.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
