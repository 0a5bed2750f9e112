"""Synthetic run records (docs/result_record.md) written to a tmp dir for the analysis tests.

`write_record` writes one result.json; `study_dir` builds a small study: per sparsity, a uniform
and a PALS-like setting, 3 seeds each, each record carrying the dense reference;
`efficiency_dir` the same sweep with speed-ups and costs (ratios to dense, no dense value).
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import numpy as np
import pytest

MODEL = "tiny-llama"
PPL = "ppl/testbed/token"
ACC = "zeroshot/boolq/acc"
AVERAGE = "zeroshot/average"
SPEEDUP_PREFILL = "speedup/prefill"
SPEEDUP_DECODE = "speedup/decode"
COST_METRICS = ("cost/flops_prefill", "cost/flops_decode", "cost/params", "cost/nonzero_params",
                "cost/weight_bytes", "cost/kv_bytes", "cost/peak_memory")
SEEDS = (0, 1, 2)
WINDOWS = 8
ITEMS = 40
DENSE_NLL = 1.5


def ppl_protocol(seqlen: int = 128) -> dict:
    return {"evaluator": "perplexity", "kind": "token", "dataset": "testbed", "split": "test",
            "seqlen": seqlen, "windows": WINDOWS, "tokens": WINDOWS * seqlen, "text_key": "abc"}


def acc_protocol() -> dict:
    return {"evaluator": "zeroshot", "task": "boolq", "split": "validation", "items": ITEMS,
            "num_fewshot": 0}


def ppl_metric(window_nll: np.ndarray, seqlen: int = 128) -> dict:
    weights = [seqlen] * len(window_nll)
    value = math.exp(float(np.average(window_nll, weights=weights)))
    return {"value": value, "higher_is_better": False, "protocol": ppl_protocol(seqlen),
            "samples": {"unit": "window", "values": [float(v) for v in window_nll],
                        "weights": weights}}


def acc_metric(correct: np.ndarray) -> dict:
    return {"value": float(np.mean(correct)), "higher_is_better": True,
            "protocol": acc_protocol(),
            "samples": {"unit": "item", "values": [int(v) for v in correct],
                        "margins": [0.1] * len(correct)}}


def signature_for(name: str) -> str:
    return hashlib.sha256(name.encode()).hexdigest()[:16]


def write_record(root: Path, signature: str, seed: int, labels: dict, pruned: dict | None,
                 dense: dict | None = None, status: str = "completed", study: str = "unit",
                 n_layers: int = 4, layer_targets: list | None = None,
                 layer_scores: list | None = None) -> Path:
    """Write records/<signature>/seed<seed>/result.json under root; returns its path."""
    sparsity = float(labels.get("sparsity") or 0.0)
    targets = layer_targets or [sparsity] * n_layers
    record = {
        "schema_version": 1, "status": status, "signature": signature, "seed": seed,
        "study": study, "labels": labels, "config": {"seed": seed},
        "started_at": "2025-01-01T00:00:00Z", "finished_at": "2025-01-01T00:01:00Z",
        "failure": None if status == "completed" else {
            "stage": "prune", "error_type": "RuntimeError", "message": "boom", "traceback": ""},
        "environment": {}, "timings": {}, "peak_memory": {}, "parameters": {},
        "sparsity": {"target": sparsity, "overall": sparsity,
                     "per_layer": [{"layer": i, "target": t, "actual": t}
                                   for i, t in enumerate(targets)], "per_linear": {}},
        "pruning": {"layer_scores": (layer_scores if layer_scores is not None
                                     else [float(i + 1) for i in range(n_layers)])},
        "metrics": None if pruned is None else {"dense": dense or {}, "pruned": pruned},
    }
    path = root / signature / f"seed{seed}" / "result.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record), encoding="utf-8")
    return path


def dense_metrics() -> dict:
    return {PPL: ppl_metric(np.full(WINDOWS, DENSE_NLL)), ACC: acc_metric(np.ones(ITEMS))}


def setting_metrics(offset: float, seed: int, accuracy: float) -> dict:
    """Window NLLs = dense + offset + a per-seed shift + fixed per-window noise."""
    rng = np.random.default_rng(1000 + seed)
    window_nll = DENSE_NLL + offset + 0.02 * seed * (1 + offset) + rng.normal(0, 0.05, WINDOWS)
    correct = (np.random.default_rng(seed).random(ITEMS) < accuracy).astype(int)
    return {PPL: ppl_metric(window_nll), ACC: acc_metric(correct)}


def labels_for(allocation: str, sparsity: float) -> dict:
    return {"model": MODEL, "method": "wanda", "sparsity": sparsity,
            "sparsity_type": "unstructured", "allocation": allocation, "recovery": "none",
            "calibration": "testbed"}


def make_study(root: Path, sparsities=(0.5,), seeds=SEEDS) -> dict[tuple[str, float], str]:
    """Uniform and PALS settings per sparsity, `seeds` each; returns (allocation, sparsity) ->
    signature. PALS is better (lower NLL) than uniform, more so at higher sparsity."""
    signatures = {}
    for sparsity in sparsities:
        for allocation, offset in (("uniform", 2 * sparsity), ("pals", 1.6 * sparsity)):
            signature = signature_for(f"{allocation}{sparsity}")
            signatures[(allocation, sparsity)] = signature
            targets = ([sparsity] * 4 if allocation == "uniform"
                       else [sparsity - 0.1, sparsity, sparsity, sparsity + 0.1])
            for seed in seeds:
                write_record(root, signature, seed, labels_for(allocation, sparsity),
                             setting_metrics(offset, seed, 0.8 - sparsity / 2 + (
                                 0.05 if allocation == "pals" else 0)),
                             dense_metrics(), layer_targets=targets)
    return signatures


def efficiency_protocol() -> dict:
    return {"evaluator": "efficiency", "device": "cpu", "dtype": "float32",
            "grid": [[1, 128], [4, 512]], "repeats": 5}


def ratio_metric(value: float, higher_is_better: bool) -> dict:
    """A speed-up or cost: the pruned model's figure over the dense one's, no samples."""
    return {"value": value, "higher_is_better": higher_is_better,
            "protocol": efficiency_protocol(), "samples": {}}


def efficiency_metrics(sparsity: float, allocation: str, seed: int) -> dict:
    """Speed-ups growing with sparsity (PALS a little slower), a per-seed timing jitter, and
    costs that shrink with sparsity."""
    jitter = 1 + 0.03 * seed
    prefill = (1 + sparsity - (0.1 if allocation == "pals" else 0.0)) * jitter
    metrics = {SPEEDUP_PREFILL: ratio_metric(prefill, True),
               SPEEDUP_DECODE: ratio_metric(0.8 * prefill, True)}
    for key in COST_METRICS:
        metrics[key] = ratio_metric(1 - sparsity * (0.5 if "bytes" in key else 0.9), False)
    return metrics


def make_efficiency_study(root: Path, sparsities=(0.5, 0.7), seeds=SEEDS,
                          model: str = MODEL) -> None:
    """`make_study`'s settings, each record also carrying the zero-shot average, speed-ups and
    costs; `model` names the model (and its signatures, so two models do not collide)."""
    for sparsity in sparsities:
        for allocation, offset in (("uniform", 2 * sparsity), ("pals", 1.6 * sparsity)):
            labels = {**labels_for(allocation, sparsity), "model": model}
            signature = signature_for(f"{model}{allocation}{sparsity}")
            for seed in seeds:
                pruned = setting_metrics(offset, seed, 0.8 - sparsity / 2)
                pruned[AVERAGE] = {**pruned[ACC], "samples": {}}
                pruned.update(efficiency_metrics(sparsity, allocation, seed))
                dense = dense_metrics()
                dense[AVERAGE] = {**dense[ACC], "samples": {}}
                write_record(root, signature, seed, labels, pruned, dense)


@pytest.fixture
def efficiency_dir(tmp_path: Path) -> Path:
    """3 seeds x 2 settings at sparsities 0.5 and 0.7, with speed-ups and costs."""
    root = tmp_path / "records"
    make_efficiency_study(root)
    return root


@pytest.fixture
def study_dir(tmp_path: Path) -> Path:
    """3 seeds x 2 settings (uniform, pals) at sparsity 0.5, with dense references."""
    root = tmp_path / "records"
    make_study(root)
    return root


@pytest.fixture
def sweep_dir(tmp_path: Path) -> Path:
    """3 seeds x 2 settings at sparsities 0.5 and 0.7."""
    root = tmp_path / "records"
    make_study(root, sparsities=(0.5, 0.7))
    return root


def markdown_header(text: str) -> list[str]:
    """The column names of the first markdown table in `text` (tabulate pads the cells)."""
    line = next(line for line in text.splitlines() if line.startswith("|"))
    return [cell.strip() for cell in line.strip().strip("|").split("|")]
