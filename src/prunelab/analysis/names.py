"""Display names for metric keys and labels: the one table every axis, legend and table header
reads, so a figure says "Perplexity (real text, token)" where the records say
`ppl/realtext/token`.

Why one table: names written at each plot call drift apart (one figure says "ppl", the next
"perplexity"), and a reader of a paper figure should never have to decode a record key. Each
entry has a long form (axes, captions) and a short form (table headers, where width matters).
Keys not in the table get a name built from their parts (`ppl/<corpus>/<kind>`,
`zeroshot/<task>/<measure>`), and anything else is shown as it is.
"""

from __future__ import annotations

from typing import Any

from prunelab.analysis.records import LABEL_PREFIX

#: key -> (long name, short name). Metric keys as in the records, label keys without "labels.".
DISPLAY_NAMES: dict[str, tuple[str, str]] = {
    "ppl/testbed/token": ("Perplexity (testbed text, token)", "PPL (testbed)"),
    "ppl/realtext/token": ("Perplexity (real text, token)", "PPL (real text)"),
    "ppl/wikitext2/token": ("Perplexity (WikiText-2, token)", "PPL (WikiText-2)"),
    "ppl/wikitext2/word": ("Perplexity (WikiText-2, word)", "Word PPL (WikiText-2)"),
    "ppl/c4/token": ("Perplexity (C4, token)", "PPL (C4)"),
    "ppl/token": ("Perplexity (own text, token)", "PPL"),
    "zeroshot/average": ("Zero-shot accuracy (avg)", "Zero-shot avg"),
    "speedup/prefill": ("Prefill speedup over dense (x)", "Prefill speedup"),
    "speedup/decode": ("Decode speedup over dense (x)", "Decode speedup"),
    "cost/flops_prefill": ("Prefill FLOPs (fraction of dense)", "FLOPs (prefill)"),
    "cost/flops_decode": ("Decode FLOPs (fraction of dense)", "FLOPs (decode)"),
    "cost/params": ("Parameters (fraction of dense)", "Params"),
    "cost/nonzero_params": ("Non-zero parameters (fraction of dense)", "Non-zero params"),
    "cost/weight_bytes": ("Weight memory (fraction of dense)", "Weight bytes"),
    "cost/kv_bytes": ("KV-cache memory (fraction of dense)", "KV-cache bytes"),
    "cost/peak_memory": ("Peak memory (fraction of dense)", "Peak memory"),
    "sparsity": ("Sparsity", "Sparsity"),
    "sparsity_type": ("Sparsity pattern", "Pattern"),
    "layers_removed": ("Layers removed", "Layers removed"),
    "method": ("Method", "Method"),
    "model": ("Model", "Model"),
    "allocation": ("Allocation", "Allocation"),
    "scorer": ("Layer scorer", "Scorer"),
    "selector": ("Selector", "Selector"),
    "recovery": ("Recovery", "Recovery"),
    "refine": ("Mask refinement", "Refinement"),
    "permutation": ("Channel permutation", "Permutation"),
    "params_removed": ("Parameters removed", "Params removed"),
    "calibration": ("Calibration data", "Calibration"),
    "layer": ("Layer", "Layer"),
}

#: Corpus and measure parts of metric keys missing from DISPLAY_NAMES.
CORPUS_NAMES = {"testbed": "testbed text", "realtext": "real text", "wikitext2": "WikiText-2",
                "c4": "C4", "ptb": "PTB"}
MEASURE_NAMES = {"acc": "accuracy", "acc_norm": "normalised accuracy"}


def display_name(key: Any) -> str:
    """The long name of a metric or label key (for axes and captions)."""
    return _names(str(key))[0]


def short_name(key: Any) -> str:
    """The short name of a metric or label key (for table headers)."""
    return _names(str(key))[1]


def is_perplexity(metric: str) -> bool:
    """Perplexity metrics: positive, spanning orders of magnitude, so plotted on a log axis."""
    return str(metric).startswith("ppl/")


def is_speedup(metric: str) -> bool:
    """Speed-ups over the dense model (`speedup/prefill`, `speedup/decode`): timings, so noisy
    across runs; tables show their median beside the mean."""
    return str(metric).startswith("speedup/")


def is_relative_to_dense(metric: str) -> bool:
    """Speed-ups and costs, each the pruned model's figure over the dense model's: the dense
    model is 1.0 by definition, so the records carry no dense value for them."""
    return str(metric).startswith(("speedup/", "cost/"))


def is_quality(metric: str) -> bool:
    """What a speed-up is traded against: perplexity and the zero-shot average."""
    return is_perplexity(metric) or str(metric).startswith("zeroshot/average")


def direction(higher_is_better: Any) -> str:
    """"↑" when higher is better, "↓" when lower is, "" when unknown."""
    if isinstance(higher_is_better, str):
        higher_is_better = {"true": True, "false": False}.get(higher_is_better.lower())
    if higher_is_better is None or higher_is_better != higher_is_better:  # None or NaN
        return ""
    return "↑" if bool(higher_is_better) else "↓"


def _names(key: str) -> tuple[str, str]:
    key = key.removeprefix(LABEL_PREFIX)
    if key in DISPLAY_NAMES:
        return DISPLAY_NAMES[key]
    parts = key.split("/")
    if parts[0] == "ppl" and len(parts) == 3:
        corpus = CORPUS_NAMES.get(parts[1], parts[1])
        prefix = "Word PPL" if parts[2] == "word" else "PPL"
        return f"Perplexity ({corpus}, {parts[2]})", f"{prefix} ({corpus})"
    if parts[0] == "zeroshot" and len(parts) == 3:
        measure = MEASURE_NAMES.get(parts[2], parts[2])
        return f"Zero-shot {measure} ({parts[1]})", parts[1]
    return key, key
