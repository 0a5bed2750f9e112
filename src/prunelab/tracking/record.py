"""The run record (`result.json`): signature, atomic writing, and where records live.

The record format is documented in docs/result_record.md. A record is written once per run, as a
whole file renamed into place, so a killed job never leaves half a record behind.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any

from prunelab.files import atomic_write

SCHEMA_VERSION = 1
# Keys that do not change what a run computes: runs differing only in these share a signature.
NON_SIGNATURE_KEYS = ("seed", "paths", "tracking", "runtime", "save_model", "hydra")


#: Keys inside a group that do not change the results: a streamed run computes what a resident
#: one does, bit for bit (models/streaming.py), so both share a signature and pair in tables; the
#: efficiency measurement (evaluation.efficiency) adds cost metrics, with their own protocol
#: stamps, and leaves the model and its quality metrics as they are.
#: accelerate's memory budget and offload folder move weights, not values (tests/test_offloaded_weights.py).
NON_SIGNATURE_FIELDS = (("model", "streaming"), ("model", "max_memory"), ("model", "offload_folder"),
                        ("evaluation", "efficiency"))


#: Keys added after records were written (a path into the config), with the value that computes
#: what those records did: a run at that value keeps the signature it had before the key existed
#: (so it still pairs with, and resumes from, the earlier records); any other value is part of the
#: signature. `evaluation.zeroshot.scorer: lm_eval` is lm-eval's own request loop, what every
#: zero-shot record before the key scored with; `shared_context` computes each shared prefix once
#: and equals it only up to float rounding, so it keeps a signature of its own.
NEUTRAL_FIELDS = {("pruning", "params_removed"): None,
                  ("evaluation", "zeroshot", "scorer"): "lm_eval"}

#: Keys whose YAML default became null ("the method's default, unless params_removed replaces
#: it", so that setting both is an error) after records were written with the default spelled out:
#: in the signature null counts as that default, so earlier records still pair with new runs.
DEFAULTED_FIELDS = {
    ("pruning", "ratio"): {"prunelab.pruning.flap.FLAP": 0.2, "prunelab.pruning.wanda_sp.WandaSP": 0.2,
                           "prunelab.pruning.magnitude_sp.MagnitudeSP": 0.2,
                           "prunelab.pruning.llm_pruner.LLMPruner": 0.25},
    ("pruning", "sparsity"): {"prunelab.pruning.slicegpt.SliceGPT": 0.25},
}


def config_signature(config: dict[str, Any]) -> str:
    """16-hex hash of the resolved config without seed, paths, tracking and runtime settings."""
    kept = {k: v for k, v in config.items() if k not in NON_SIGNATURE_KEYS}
    for group, field in NON_SIGNATURE_FIELDS:
        if isinstance(kept.get(group), dict) and field in kept[group]:
            kept[group] = {k: v for k, v in kept[group].items() if k != field}
    for (group, field), defaults in DEFAULTED_FIELDS.items():
        section = kept.get(group)
        if isinstance(section, dict) and section.get(field, 0) is None and section.get("_target_") in defaults:
            kept[group] = {**section, field: defaults[section["_target_"]]}
    for path, neutral in NEUTRAL_FIELDS.items():
        kept = _without_neutral(kept, path, neutral)
    return hashlib.sha256(json.dumps(kept, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _without_neutral(config: dict[str, Any], path: tuple[str, ...], neutral: Any) -> dict[str, Any]:
    """`config` without the key at `path` where it holds `neutral` (copied along the path only)."""
    head, *rest = path
    if head not in config:
        return config
    if not rest:
        return {k: v for k, v in config.items() if k != head} if config[head] == neutral else config
    if not isinstance(config[head], dict):
        return config
    return {**config, head: _without_neutral(config[head], tuple(rest), neutral)}


def record_path(records_dir: str | Path, signature: str, seed: int) -> Path:
    return Path(records_dir) / signature / f"seed{seed}" / "result.json"


def _clean(value: Any) -> Any:
    """JSON-safe: NaN/inf become null (strict JSON readers reject them)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def write_record(path: str | Path, record: dict[str, Any]) -> Path:
    """Write JSON atomically: temporary file in the same folder, fsync, rename."""
    text = json.dumps(_clean(record), indent=1, default=str).encode()
    return atomic_write(path, lambda handle: handle.write(text), "the record")


def read_record(path: str | Path) -> dict[str, Any] | None:
    """The record at `path`, or None if it is missing or unreadable."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError):
        return None


def is_completed(path: str | Path) -> bool:
    record = read_record(path)
    return bool(record) and record.get("status") == "completed"
