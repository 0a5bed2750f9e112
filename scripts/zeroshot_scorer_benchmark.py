"""Shared-context scorer against lm-eval's HFLM on the offline standard tasks: time, log-lik diff, agreement.

Both run the same lm-eval task configs (the seeded subset of `--items` per task) through
`simple_evaluate` on the same in-memory model, alternated A B A B (`--reps`), one torch thread by
default. Reported, per task and in all: the median time of the scoring calls (`loglikelihood`) for
each and their ratio, the largest |log-likelihood difference| over all requests, and
how many items choose the same answer under acc and under acc_norm.

    python scripts/zeroshot_scorer_benchmark.py --model testbed_llama --items 40
    python scripts/zeroshot_scorer_benchmark.py --model smollm2_135m --items 50 --out result.json
    python scripts/zeroshot_scorer_benchmark.py --render result.json     # its markdown table
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

TASKS = ("boolq", "rte", "hellaswag", "winogrande", "arc_easy", "arc_challenge", "openbookqa")


def run_once(lm, configs: list[dict]) -> tuple[dict, dict[str, float]]:
    """One evaluation, task by task: the merged output and each task's seconds in `loglikelihood`."""
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    spent = [0.0]
    original = lm.loglikelihood

    def timed(requests, *args, **kwargs):
        start = time.perf_counter()
        try:
            return original(requests, *args, **kwargs)
        finally:
            spent[0] += time.perf_counter() - start

    lm.loglikelihood = timed
    merged: dict = {"samples": {}, "results": {}}
    seconds = {}
    for config in configs:
        spent[0] = 0.0
        out = simple_evaluate(model=lm, tasks=[config], num_fewshot=0, log_samples=True, verbosity="ERROR",
                              task_manager=TaskManager(include_defaults=False))
        merged["samples"].update(out["samples"])
        merged["results"].update(out["results"])
        seconds[config["task"]] = spent[0]
    lm.loglikelihood = original
    return merged, seconds


def chosen(sample: dict, metric: str) -> int:
    """The answer a sample picks: argmax log-likelihood (acc) or per character of the choice (acc_norm)."""
    scores = [float(resp[0]) for resp in sample["filtered_resps"]]
    if metric == "acc_norm":
        scores = [s / len(args[1]) for s, args in zip(scores, sample["arguments"])]
    return max(range(len(scores)), key=scores.__getitem__)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="testbed_llama")
    parser.add_argument("--items", type=int, default=40)
    parser.add_argument("--tasks", nargs="+", default=list(TASKS))
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out")
    parser.add_argument("--render", metavar="JSON", help="print the markdown table of a written report")
    args = parser.parse_args()
    if args.render:
        print(render(json.loads(open(args.render).read())))
        return
    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()[0]

    from lm_eval.models.huggingface import HFLM

    import prunelab
    from prunelab.evaluation import benchmark_tasks
    from prunelab.evaluation.shared_context import SharedContextLM

    model, tokenizer = prunelab.load(args.model, device=args.device)
    model.eval()
    configs = [benchmark_tasks.build(t, subset=args.items, seed=0).config for t in args.tasks]
    scorers = {"lm_eval": HFLM(pretrained=model, tokenizer=tokenizer, batch_size=args.batch_size),
               "shared_context": SharedContextLM(pretrained=model, tokenizer=tokenizer, batch_size=args.batch_size)}
    times: dict[str, list[dict[str, float]]] = {name: [] for name in scorers}
    outs = {}
    for _ in range(args.reps):  # A B A B: the machines drift, a ratio is only worth its neighbours'
        for name, lm in scorers.items():
            out, seconds = run_once(lm, configs)
            times[name].append(seconds)
            outs[name] = out
    report: dict = {"model": args.model, "items_per_task": args.items, "threads": args.threads,
                    "batch_size": args.batch_size, "device": args.device, "reps": args.reps, "tasks": {}}
    for name in scorers:
        report[f"{name}_scoring_s"] = statistics.median(sum(rep.values()) for rep in times[name])
    report["scoring_time_ratio"] = report["shared_context_scoring_s"] / report["lm_eval_scoring_s"]
    worst = 0.0
    for task in args.tasks:
        ref = sorted(outs["lm_eval"]["samples"][task], key=lambda s: s["doc_id"])
        new = sorted(outs["shared_context"]["samples"][task], key=lambda s: s["doc_id"])
        diffs = [abs(float(a[0]) - float(b[0])) for r, n in zip(ref, new)
                 for a, b in zip(r["filtered_resps"], n["filtered_resps"])]
        greedy = sum(bool(a[1]) == bool(b[1]) for r, n in zip(ref, new)
                     for a, b in zip(r["filtered_resps"], n["filtered_resps"]))
        seconds = {name: statistics.median(rep[task] for rep in times[name]) for name in scorers}
        row = {"items": len(ref), "requests": len(diffs), "max_abs_loglik_diff": max(diffs),
               "lm_eval_s": seconds["lm_eval"], "shared_context_s": seconds["shared_context"],
               "time_ratio": seconds["shared_context"] / seconds["lm_eval"],
               "is_greedy_agree": f"{greedy}/{len(diffs)}"}
        for metric in ("acc", "acc_norm"):
            if metric in ref[0]:
                same = sum(chosen(r, metric) == chosen(n, metric) for r, n in zip(ref, new))
                row[f"{metric}_chosen_agree"] = f"{same}/{len(ref)}"
                row[f"{metric}_lm_eval"] = outs["lm_eval"]["results"][task][f"{metric},none"]
                row[f"{metric}_shared_context"] = outs["shared_context"]["results"][task][f"{metric},none"]
        report["tasks"][task] = row
        worst = max(worst, row["max_abs_loglik_diff"])
    report["max_abs_loglik_diff"] = worst
    report["load_average_1min"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]  # other work on the machine
    print(json.dumps(report, indent=1))
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(report, handle, indent=1)


def render(report: dict) -> str:
    """The report as the markdown table the README and results/zeroshot_scorer/ show."""
    lines = ["| task | items | requests | HFLM s | shared-context s | ratio | max abs log-lik diff | "
             "same answer (acc) | same answer (acc_norm) |", "|---|---|---|---|---|---|---|---|---|"]
    for task, row in report["tasks"].items():
        lines.append(f"| {task} | {row['items']} | {row['requests']} | {row['lm_eval_s']:.1f} | "
                     f"{row['shared_context_s']:.1f} | {row['time_ratio']:.2f} | {row['max_abs_loglik_diff']:.1e} | "
                     f"{row['acc_chosen_agree']} | {row.get('acc_norm_chosen_agree', '-')} |")
    lines.append(f"| all | | | {report['lm_eval_scoring_s']:.1f} | {report['shared_context_scoring_s']:.1f} | "
                 f"{report['scoring_time_ratio']:.2f} | {report['max_abs_loglik_diff']:.1e} | | |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
