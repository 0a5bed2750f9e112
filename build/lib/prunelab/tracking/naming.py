"""Readable names for a run on a dashboard, from its labels: what a researcher scans a W&B
project for (method, sparsity or layers removed, allocation or scorer, recovery, model, seed).

The signature (the config hash that groups seeds in the records) stays in the run's config and
ends the group name, so two settings that share their labels but differ elsewhere (`ties`, a
calibration size) never fall into one group.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class RunNames:
    name: str  # one run: the setting and its seed
    group: str  # the setting across seeds
    job_type: str  # the method
    tags: tuple[str, ...]


def setting_name(labels: dict[str, Any]) -> str:
    """'wanda-0.5-owl-smollm2_135m', 'sparsegpt-2:4-testbed_llama', 'depth-4L-angular-ghosted-...'."""
    method = str(labels.get("method", "run"))
    parts = [method]
    if labels.get("layers_removed") is not None:
        parts += [f"{labels['layers_removed']}L", str(labels.get("scorer", ""))]
    elif method != "dense":
        sparsity_type = labels.get("sparsity_type") or "unstructured"
        parts.append(sparsity_type if sparsity_type != "unstructured" else f"{labels.get('sparsity', '')}")
        if sparsity_type == "unstructured" and labels.get("allocation"):
            parts.append(str(labels["allocation"]))
    if labels.get("recovery") not in (None, "none"):
        parts.append(str(labels["recovery"]))
    parts.append(str(labels.get("model", "model")))
    return "-".join(p for p in parts if p)


def run_names(labels: dict[str, Any], seed: int, signature: str, study: str | None = None) -> RunNames:
    setting = setting_name(labels)
    keys = ("model", "method", "allocation", "scorer", "recovery", "sparsity_type")
    tags = [str(labels[k]) for k in keys if labels.get(k) not in (None, "none", "unstructured")]
    return RunNames(name=f"{setting}-seed{seed}", group=f"{setting}-{signature[:6]}",
                    job_type=str(labels.get("method", "run")), tags=tuple(([study] if study else []) + tags))
