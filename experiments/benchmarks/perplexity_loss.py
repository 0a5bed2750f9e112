"""Benchmark: the perplexity evaluator's loss, before and after it moved to the last dimension.

On SmolLM2-135M (49,152-word vocabulary), the real-model protocol's 16 spread windows of 512
tokens, batches of 4 (`evaluation=realtext`). Each form runs in its own process, so peak memory is
that form's alone: the process's peak RSS is reset after the model is loaded and the windows are
built (/proc/self/clear_refs), then read after the evaluation.

- `strided` (before): cross_entropy(logits[:, :-1].transpose(1, 2)) in float32, the vocabulary
  on a strided middle dimension;
- `plain_loop`: torch.nn.CrossEntropyLoss on each window's [T-1, V] logits, the mean in float32;
- `prunelab` (after): `evaluation.perplexity.window_nlls`, the loss over the last dimension a chunk
  of positions at a time, summed in float64.
Each is compared with a float64 log-softmax of the same logits (the exact value). The whole
evaluation's seconds depend on what else the machine runs; `loss_seconds_per_batch` times the loss
alone, the forms interleaved, on one batch's logits.

    python experiments/benchmarks/perplexity_loss.py --out results/benchmarks
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path

FORMS = ("strided", "plain_loop", "prunelab")


def peak_rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def current_rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def windows_and_model():
    import torch

    from prunelab.cli import model_preset
    from prunelab.data import TokenCache
    from prunelab.data.tokens import eval_token_stream
    from prunelab.evaluation.perplexity import selected_windows
    from prunelab.models import load_model

    torch.set_num_threads(2)
    loaded = load_model(model_preset("smollm2_135m", device="cpu"))
    ids = eval_token_stream("realtext", loaded.tokenizer, 512, (), TokenCache(None))
    return loaded.model, selected_windows(ids, 512, 16, "spread")  # [16, 512]


def measure(form: str) -> dict:
    """One form's per-window NLLs, seconds and peak memory above the loaded model."""
    import torch
    import torch.nn.functional as F

    from prunelab.evaluation.perplexity import window_nlls

    model, windows = windows_and_model()
    Path("/proc/self/clear_refs").write_text("5")  # reset the peak RSS to the current RSS
    base = current_rss_bytes()
    start = time.perf_counter()
    with torch.no_grad():
        if form == "prunelab":
            nlls = window_nlls(model, windows.reshape(1, -1), 512, batch_size=4, progress=False)
        else:
            nlls = []
            for b in range(0, windows.shape[0], 4):
                batch = windows[b : b + 4]
                logits = model(input_ids=batch, use_cache=False).logits.float()  # [4, T, V]
                if form == "strided":
                    loss = F.cross_entropy(logits[:, :-1].transpose(1, 2), batch[:, 1:], reduction="none")
                    nlls += loss.mean(dim=1).tolist()
                else:
                    nlls += [float(torch.nn.CrossEntropyLoss()(logits[r, :-1], batch[r, 1:]))
                             for r in range(batch.shape[0])]
    seconds = time.perf_counter() - start
    peak = peak_rss_bytes() - base
    with torch.no_grad():  # the exact value, outside the measured part
        exact = []
        for b in range(0, windows.shape[0], 4):
            batch = windows[b : b + 4]
            logp = torch.log_softmax(model(input_ids=batch, use_cache=False).logits.double(), dim=-1)
            exact += (-logp[:, :-1].gather(2, batch[:, 1:, None]).squeeze(2).mean(dim=1)).tolist()
    return {"form": form, "seconds": seconds, "peak_above_model_mb": peak / 2**20,
            "ppl": math.exp(sum(nlls) / len(nlls)), "ppl_exact": math.exp(sum(exact) / len(exact)),
            "max_window_error": max(abs(a - b) for a, b in zip(nlls, exact))}


def loss_only(repeats: int = 7) -> list[dict]:
    """Seconds of the loss alone on one batch's logits ([4, 512, V], computed once), each form
    timed `repeats` times interleaved with the others (median), so a busy machine slows all alike."""
    import statistics

    import torch
    import torch.nn.functional as F

    from prunelab.evaluation.perplexity import summed_nll

    model, windows = windows_and_model()
    batch = windows[:4]
    with torch.no_grad():
        logits = model(input_ids=batch, use_cache=False).logits.float()  # [4, T, V]
    forms = {
        "strided": lambda: F.cross_entropy(logits[:, :-1].transpose(1, 2), batch[:, 1:], reduction="none").mean(1),
        "plain_loop": lambda: [torch.nn.CrossEntropyLoss()(logits[r, :-1], batch[r, 1:]) for r in range(4)],
        "prunelab": lambda: [summed_nll(logits[r, :-1], batch[r, 1:]) for r in range(4)],
    }
    times: dict[str, list[float]] = {name: [] for name in forms}
    for _ in range(repeats):
        for name, form in forms.items():
            start = time.perf_counter()
            form()
            times[name].append(time.perf_counter() - start)
    return [{"form": name, "loss_seconds_per_batch": statistics.median(t)} for name, t in times.items()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("results/benchmarks"))
    parser.add_argument("--form", choices=FORMS, help="(internal) measure one form in this process")
    args = parser.parse_args()
    if args.form:
        print(json.dumps(measure(args.form)))
        return
    import pandas as pd

    rows = []
    for form in FORMS:
        out = subprocess.run([sys.executable, __file__, "--form", form], capture_output=True, text=True,
                             check=True).stdout.strip().splitlines()[-1]
        rows.append(json.loads(out))
        print(rows[-1], flush=True)
    table = pd.DataFrame(rows).merge(pd.DataFrame(loss_only()), on="form")
    table["ppl_relative_error"] = (table["ppl"] / table["ppl_exact"] - 1).abs()
    args.out.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out / "perplexity_loss.csv", index=False)
    (args.out / "perplexity_loss.md").write_text(table.to_markdown(index=False, floatfmt=".6g") + "\n")
    print(table.to_markdown(index=False, floatfmt=".6g"))


if __name__ == "__main__":
    main()
