"""Benchmark: pruning and evaluating models larger than the memory cap, decoder layers streamed.

Two random-init Llamas saved as safetensors (weights only matter for memory and time):
- A: 20 layers, hidden 1536 (2.4 GB in fp32), run under `prlimit --data=1GiB`;
- B: 12 layers, hidden 4096 (9.6 GB), run under `prlimit --data=3GiB`.
Each run is the real CLI (`prunelab model.name_or_path=<folder> model.streaming=...`): load,
dense token perplexity, Wanda or SparseGPT 50%, pruned perplexity. From each run's record: the
peak resident memory of every stage against the streamed bound (one layer + embeddings and head
+ two activation buffers + the method's state + the process), and the CPU time (user + system,
from wait4) against the resident run of the same model and method. The resident run is also
started under the same cap, to show that the cap is real. On A, the streamed and resident runs'
pruned checkpoints (`save_model=true`) are compared tensor by tensor, and their per-window NLLs.

    python experiments/benchmarks/streaming_benchmark.py --models A B --methods wanda sparsegpt \
        --out results/benchmarks
    python experiments/benchmarks/streaming_benchmark.py --models A --methods sparsegpt --save-models \
        --runs streamed resident streamed_uncapped --out results/benchmarks/quiet_machine \
        --machine "2-core machine with nothing else running"     # the quiet-machine table

Calibration and evaluation are sized for minutes on 2 CPU cores (the flags say how); the memory
bound scales with them and is printed beside every measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import torch

MODELS = {
    "A": dict(hidden_size=1536, intermediate_size=4096, num_hidden_layers=20, num_attention_heads=12,
              num_key_value_heads=4, cap_gib=1),
    "B": dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=12, num_attention_heads=32,
              num_key_value_heads=8, cap_gib=3),
}
VOCAB = 32000
MB = 1024**2


def build_model(name: str, folder: Path) -> Path:
    """A random-init Llama of shape `MODELS[name]`, saved once (safetensors, 2 GB shards), with
    the testbed tokenizer."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    import prunelab

    if (folder / "config.json").exists():
        return folder
    shape = {k: v for k, v in MODELS[name].items() if k != "cap_gib"}
    config = LlamaConfig(vocab_size=VOCAB, max_position_embeddings=2048, tie_word_embeddings=False, **shape)
    torch.manual_seed(0)
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    model = model.to_empty(device="cpu")
    with torch.no_grad():
        for p in model.parameters():
            torch.nn.init.normal_(p, std=0.02)
    tmp = folder.with_name(folder.name + ".partial")
    model.save_pretrained(tmp, max_shard_size="2GB")
    AutoTokenizer.from_pretrained(prunelab.shipped_model("testbed_llama")).save_pretrained(tmp)
    del model
    tmp.replace(folder)
    return folder


def run_cli(tag: str, folder: Path, method: str, streaming: bool, cap_gib: int | None, work: Path,
            args) -> dict:
    """One CLI run, optionally under `prlimit --data`; its record and its CPU time."""
    records = work / "records" / tag
    for stale in (records, work / "cache" / tag, work / "outputs" / tag):  # every run from scratch:
        shutil.rmtree(stale, ignore_errors=True)  # no dense metrics or tokens cached by an earlier run
    overrides = [
        f"model.name_or_path={folder}", f"model.label={folder.name}", f"model.streaming={str(streaming).lower()}",
        "model.device=cpu", f"pruning={method}", "pruning.sparsity=0.5", "data=testbed",
        f"data.calibration.nsamples={args.nsamples}", f"data.calibration.seqlen={args.seqlen}",
        "evaluation=ppl", f"evaluation.perplexity.seqlen={args.eval_seqlen}",
        f"evaluation.perplexity.max_windows={args.eval_windows}",
        f"evaluation.perplexity.batch_size={args.eval_batch}",
        "tracking=none", "runtime.progress=false", f"runtime.threads={args.threads}",
        f"paths.records_dir={records}", f"paths.cache_dir={work / 'cache' / tag}",
        f"hydra.run.dir={work / 'outputs' / tag}", f"save_model={str(args.save_models).lower()}",
    ]
    command = [str(Path(sys.executable).with_name("prunelab")), *overrides]
    if cap_gib:
        command = ["prlimit", f"--data={int(cap_gib * 1024**3)}", "--", *command]
    # the capped resident run skips prunelab's refusal, so that it meets the cap itself
    skip = "1" if cap_gib and not streaming else ""
    env = {**os.environ, "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1", "PRUNELAB_SKIP_MEMORY_CHECK": skip}
    log = work / "logs" / f"{tag}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with open(log, "w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
        _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - start
    code = os.waitstatus_to_exitcode(status)
    found = sorted(records.rglob("result.json"))
    record = json.loads(found[0].read_text()) if found else {}
    last = [line for line in log.read_text().splitlines() if line.strip()][-1:] or [""]
    return {"record": record, "exit": code, "wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime,
            "max_rss_mb": usage.ru_maxrss / 1024, "last_line": last[0][-240:]}


def compare_outputs(a: dict, b: dict) -> dict:
    """Per-window NLLs (dense and pruned) and, when both saved their model, every tensor."""
    out = {}
    for stage in ("dense", "pruned"):
        ka = {k: v["samples"]["values"] for k, v in a["metrics"][stage].items()}
        kb = {k: v["samples"]["values"] for k, v in b["metrics"][stage].items()}
        out[f"{stage}_nlls_equal"] = ka == kb
    out["sparsity_equal"] = a["sparsity"] == b["sparsity"]
    if a.get("saved_model") and b.get("saved_model"):
        from prunelab.models.safetensors_files import checkpoint_tensors, read_tensor

        ta, tb = checkpoint_tensors(a["saved_model"]), checkpoint_tensors(b["saved_model"])
        out["tensors"] = len(ta)
        out["tensors_equal"] = set(ta) == set(tb) and all(
            torch.equal(read_tensor(ta[name]), read_tensor(tb[name])) for name in ta)
    return out


def row(model: str, method: str, mode: str, cap: int | None, result: dict) -> dict:
    record = result["record"]
    memory = record.get("memory", {})
    estimate = memory.get("estimate_bytes", {})
    peaks = memory.get("stage_peak_rss_bytes", {})
    out = {"model": model, "method": method, "mode": mode, "cap_gib": cap or "none",
           "calibration": record.get("labels", {}).get("calibration"),
           "status": record.get("status", "no record") if result["exit"] == 0 else
           f"failed (exit {result['exit']})", "wall_s": round(result["wall_s"], 1),
           "cpu_s": round(result["cpu_s"], 1), "max_rss_mb": round(result["max_rss_mb"])}
    for stage in ("load", "dense_eval", "prune", "evaluate", "save"):
        if stage in peaks:
            out[f"peak_{stage}_mb"] = round(peaks[stage] / MB)
    for part in ("whole_model", "outside_layers", "largest_layer", "largest_streamed", "activations",
                 "method_state", "baseline", "streamed"):
        if part in estimate:
            out[f"bound_{part}_mb"] = round(estimate[part] / MB)
    if record.get("failure"):
        out["failure"] = f"{record['failure']['error_type']}: {record['failure']['message'][:160]}"
    elif result["exit"] != 0:
        out["failure"] = result["last_line"]
    if record.get("metrics", {}).get("pruned"):
        out["ppl_pruned"] = next(iter(record["metrics"]["pruned"].values()))["value"]
    return out


def render(table: pd.DataFrame, comparisons: list[dict], args) -> str:
    from tabulate import tabulate

    lines = ["# Streaming benchmark: models larger than the memory cap", "",
             "Random-init Llamas (fp32), Wanda / SparseGPT 50%, calibration as the `calibration` column says "
             f"(testbed tokens x sequences x length), token perplexity on {args.eval_windows} windows of "
             f"{args.eval_seqlen} (dense and pruned), torch threads {args.threads}, {args.machine}. Command: `python experiments/benchmarks/streaming_benchmark.py` (see "
             "its docstring).", "",
             "Peaks are the peak resident memory of each stage (VmHWM, reset per stage); the bound is the "
             "streamed estimate the run was admitted under: the largest module read at once (a layer, the "
             "embeddings or the head) + the final norm + two activation buffers + method state + the "
             "process's private memory before loading (VmData under a data limit). The two are not the same "
             "measure: RSS counts the pages of the shared libraries (about 90 MB here), the bound and the cap "
             "(`prlimit --data`) count the data segment, reserved as well as touched; a run completing under "
             "the cap is what shows it fits.", ""]
    shown = [c for c in ["model", "method", "mode", "cap_gib", "calibration", "status", "cpu_s", "cpu_vs_resident",
                         "peak_load_mb", "peak_dense_eval_mb", "peak_prune_mb", "peak_evaluate_mb",
                         "bound_streamed_mb", "bound_whole_model_mb", "ppl_pruned", "failure"] if c in table]
    lines.append(tabulate(table[shown].astype(object).fillna(""), headers="keys", tablefmt="github", showindex=False))
    lines += ["", "Bound parts (MB):", ""]
    parts = [c for c in table.columns if c.startswith("bound_")]
    lines.append(tabulate(table[["model", "method", "mode", *parts]].drop_duplicates(["model", "method", "mode"]).astype(object)
                          .fillna(""), headers="keys", tablefmt="github", showindex=False))
    if comparisons:
        lines += ["", "Streamed against resident (same model, method, calibration):", "",
                  tabulate(pd.DataFrame(comparisons).astype(object).fillna(""), headers="keys", tablefmt="github",
                           showindex=False)]  # object: a missing cell must not turn True into 1.0
    return "\n".join(lines) + "\n"


#: (streaming, capped); `streamed_uncapped`: the streamed run without a data limit, where the
#: allocator settings that keep the data segment small (`models.streaming`) are not applied
RUNS = {"streamed": (True, True), "capped": (False, True), "resident": (False, False),
        "streamed_uncapped": (True, False)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["A", "B"], choices=sorted(MODELS))
    parser.add_argument("--methods", nargs="+", default=["wanda", "sparsegpt"])
    parser.add_argument("--runs", nargs="*", default=["streamed", "capped", "resident"], choices=list(RUNS),
                        help="which runs to (re)do; the others are read from --work")
    parser.add_argument("--work", type=Path, default=Path("/tmp/prunelab-streaming-benchmark"))
    parser.add_argument("--out", type=Path, default=Path("results/benchmarks"))
    parser.add_argument("--nsamples", type=int, default=16)
    parser.add_argument("--seqlen", type=int, default=128)
    parser.add_argument("--eval-seqlen", type=int, default=256)
    parser.add_argument("--eval-windows", type=int, default=4)
    parser.add_argument("--eval-batch", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--save-models", action="store_true", help="save both pruned models and compare "
                        "every tensor")
    parser.add_argument("--cap-gib", type=float, default=None, help="another cap than the model's (its runs "
                        "are kept beside the ones under the model's cap)")
    parser.add_argument("--machine", default="2-core machine shared with a study running at nice 5",
                        help="the load on the machine during the runs, for the table's header")
    args = parser.parse_args()
    done = args.work / "results"
    done.mkdir(parents=True, exist_ok=True)
    for model in args.models:
        folder = build_model(model, args.work / "models" / model)
        cap = args.cap_gib or MODELS[model]["cap_gib"]
        for method in args.methods:
            for run in args.runs:
                streaming, capped = RUNS[run]
                tag = f"{model}-{method}-{run}" + (f"-cap{cap:g}" if args.cap_gib and capped else "")
                result = run_cli(tag, folder, method, streaming, cap if capped else None, args.work, args)
                result["row"] = row(model, method, "streamed" if streaming else "resident",
                                    cap if capped else None, result)
                (done / f"{tag}.json").write_text(json.dumps(result, default=str))
                print(tag, result["row"]["status"], f"{result['cpu_s']:.0f} s CPU", flush=True)
    rows, comparisons = [], []
    for model in MODELS:
        for method in ("wanda", "sparsegpt"):
            results = {path.stem.removeprefix(f"{model}-{method}-"): json.loads(path.read_text())
                       for path in sorted(done.glob(f"{model}-{method}-*.json"))}
            base = results.get("resident")
            for run, result in results.items():
                r = {**result["row"], "calibration": result["record"].get("labels", {}).get("calibration")}
                ok = base and base["row"]["status"] == "completed" and r["status"] == "completed"
                r["cpu_vs_resident"] = round(r["cpu_s"] / base["row"]["cpu_s"], 2) if ok else None
                rows.append(r)
            for run, streamed in results.items():
                if run.startswith("streamed") and base and all(
                        x["record"].get("status") == "completed" for x in (base, streamed)):
                    comparisons.append({"model": model, "method": method, "cap_gib": streamed["row"]["cap_gib"],
                                        **compare_outputs(streamed["record"], base["record"])})
    table = pd.DataFrame(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out / "streaming_benchmark.csv", index=False)
    (args.out / "streaming_benchmark.md").write_text(render(table, comparisons, args))
    print((args.out / "streaming_benchmark.md").read_text())


if __name__ == "__main__":
    main()
