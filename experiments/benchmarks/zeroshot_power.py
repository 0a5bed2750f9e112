"""How many zero-shot items does a paired comparison need? Measured from two runs' per-item results.

For two models scored on the same items (dense and pruned in one record, or two records), a paired
test of their accuracy (McNemar) sees only the items whose correctness differs; with q the share of
such items, n items detect a difference of about

    delta = (z_{1-alpha/2} + z_{power}) * sqrt(q / n)        (alpha 0.05, power 0.8: 2.80 * sqrt(q / n))

(the normal approximation of Connor's sample size for McNemar's test, for delta small against q),
so n = 7.84 q / delta^2 items detect delta. This script reads q off the records (per task, from the
items' correctness under the task's metric) and writes, per task and for the 7-task average, the
measured q, the change detectable with the protocol's items, and the items a 1-point change needs:
the measured power estimate behind `evaluation=standard_cpu`'s 250 items per task.

    python experiments/benchmarks/zeroshot_power.py /tmp/records/<signature>/seed0/result.json \
        --out results/zeroshot_baselines/power.md
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

Z = 1.959964 + 0.841621  # two-sided alpha 0.05, power 0.8


def per_item(metric: dict) -> dict[str, float]:
    samples = metric.get("samples") or {}
    ids, values = samples.get("ids"), samples.get("values")
    if not ids or values is None:
        raise SystemExit(f"no per-item results in {metric.get('protocol', {}).get('task', 'a metric')}")
    return dict(zip(ids, values))


def discordance(a: dict[str, float], b: dict[str, float]) -> tuple[float, int]:
    shared = sorted(set(a) & set(b))
    return sum(a[i] != b[i] for i in shared) / len(shared), len(shared)


def detectable(q: float, n: int) -> float:
    return Z * math.sqrt(q / n)


def items_for(q: float, delta: float) -> int:
    return math.ceil(Z * Z * q / delta ** 2)


def power_table(record: dict) -> list[dict]:
    dense, pruned = record["metrics"]["dense"], record["metrics"]["pruned"]
    rows, all_q, all_n = [], 0.0, 0
    for key in sorted(k for k in pruned if k.startswith("zeroshot/") and k.count("/") == 2):
        if key not in dense or not (pruned[key].get("samples") or {}).get("ids"):
            continue
        q, n = discordance(per_item(dense[key]), per_item(pruned[key]))
        rows.append({"task": key.split("/")[1], "items": n, "dense": dense[key]["value"], "pruned": pruned[key]["value"],
                     "q": q, "detectable": detectable(q, n), "items_for_1pt": items_for(q, 0.01)})
        all_q, all_n = all_q + q * n, all_n + n
    if rows:  # the average over tasks of equal size: the pooled items
        q = all_q / all_n
        rows.append({"task": "average (pooled)", "items": all_n, "dense": None, "pruned": None, "q": q,
                     "detectable": detectable(q, all_n), "items_for_1pt": items_for(q, 0.01)})
    return rows


def render(rows: list[dict], source: str, labels: dict) -> str:
    head = ("| task | items | dense acc | pruned acc | q (items that differ) | detectable change | "
            "items for 1 point |\n|---|---:|---:|---:|---:|---:|---:|")
    def percent(value):
        return "" if value is None else f"{100 * value:.1f}"

    body = [f"| {r['task']} | {r['items']} | {percent(r['dense'])} | {percent(r['pruned'])} | {r['q']:.3f} | "
            f"{100 * r['detectable']:.1f} points | {r['items_for_1pt']:,} |" for r in rows]
    setting = ", ".join(f"{k}={v}" for k, v in labels.items())
    return "\n".join([
        "# How many zero-shot items a paired comparison needs (measured)", "",
        f"Written by `experiments/benchmarks/zeroshot_power.py` from `{source}` ({setting}): the dense model "
        "and the pruned one on the same items. q is the share of items whose correctness (the task's "
        "metric) differs between the two; a paired McNemar test (alpha 0.05, power 0.8) then detects about "
        "2.80 x sqrt(q / n) with n items, and needs 7.84 q / 0.01^2 items for a 1-point change. Comparing "
        "two pruned models (two methods, two seeds) usually gives a smaller q than dense against pruned, "
        "and so a smaller detectable change.", "", head, *body, ""])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("record", type=Path, help="a result.json with dense and pruned zero-shot items")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    record = json.loads(args.record.read_text())
    text = render(power_table(record), args.record.name if args.out is None else str(args.record),
                  record.get("labels", {}))
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
