"""lm-eval's own standard tasks (boolq, rte, hellaswag, ...) over the offline copy of their splits.

Each task config is lm-eval's installed YAML (prompt, choices, target, metric list, version,
`process_docs`), loaded with lm-eval's YAML loader; only the data source changes: the hub dataset is
replaced by the JSON lines `prunelab install-data` wrote (`prunelab.data.benchmarks`), given by
absolute path (lm-eval resolves relative `data_files` against the working directory).

A subset (`evaluation.zeroshot.subset: N`, for CPU runs) is N row indices drawn without
replacement by a generator seeded with the data version, the task and `subset_seed`, kept in the
published order: the same items every run. It is written as its own JSON lines file, so lm-eval
(and the equality test, which runs lm-eval's unmodified task on that file) sees only those docs.
Items are named `<task>:<row index in the published split>`; the record stamps a hash of the names.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import random
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prunelab.data import benchmarks
from prunelab.errors import ConfigError

#: task -> lm-eval YAML under lm_eval/tasks/ (the one that registers that task name)
LM_EVAL_YAML = {
    "boolq": "super_glue/boolq/default.yaml",
    "rte": "glue/rte/default.yaml",
    "hellaswag": "hellaswag/hellaswag.yaml",
    "winogrande": "winogrande/default.yaml",
    "arc_easy": "arc/arc_easy.yaml",
    "arc_challenge": "arc/arc_challenge.yaml",
    "openbookqa": "openbookqa/openbookqa.yaml",
    "piqa": "piqa/piqa.yaml",
    "copa": "super_glue/copa/default.yaml",
}
TASKS: tuple[str, ...] = tuple(LM_EVAL_YAML)
_SPLIT_KEYS = ("training_split", "validation_split", "test_split", "fewshot_split")


def check_task_names(names: list[str] | tuple[str, ...], others: tuple[str, ...] = ()) -> None:
    """A ConfigError (one line, with the closest names) for a name that is no offline task."""
    known = (*TASKS, *others)
    for name in names:
        if name not in known:
            close = difflib.get_close_matches(name, known, n=3)
            hint = f"did you mean {', '.join(close)}? " if close else ""
            raise ConfigError(f"unknown zero-shot task {name!r}; {hint}available offline: {', '.join(TASKS)}")


def lm_eval_config(task: str) -> dict[str, Any]:
    """lm-eval's installed config for `task` (includes merged, `!function`s resolved), unmodified."""
    import lm_eval.tasks
    from lm_eval.tasks._yaml_loader import load_yaml

    path = Path(lm_eval.tasks.__file__).parent / LM_EVAL_YAML[task]
    config = load_yaml(path, resolve_func=True)
    if config.get("task") != task:
        raise ConfigError(f"lm-eval's {path} no longer defines task {task!r} (found {config.get('task')!r}); "
                          "update prunelab.evaluation.benchmark_tasks.LM_EVAL_YAML")
    return config


def with_local_data(config: dict[str, Any], data_file: Path) -> dict[str, Any]:
    """`config` with its hub dataset replaced by `data_file` (absolute) as its only (test) split."""
    out = {k: v for k, v in config.items() if k not in ("tag", "dataset_name", *_SPLIT_KEYS)}
    out.update(dataset_path="json", dataset_kwargs={"data_files": {"test": str(Path(data_file).resolve())}},
               test_split="test")
    return out


def version(config: dict[str, Any]) -> str:
    return str((config.get("metadata") or {}).get("version"))


def metrics_offered(config: dict[str, Any]) -> tuple[str, ...]:
    return tuple(m["metric"] for m in config.get("metric_list", ()))


def subset_rows(task: str, rows: int, size: int | None, seed: int) -> list[int]:
    """Row indices of the seeded subset (all rows when `size` is None or not smaller), ascending."""
    if size is None or size >= rows:
        return list(range(rows))
    rng = random.Random(f"{benchmarks.DATA_VERSION}:{task}:{seed}")
    return sorted(rng.sample(range(rows), size))


def ids_hash(ids: list[str]) -> str:
    return hashlib.sha256(json.dumps(ids).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class BenchmarkTask:
    """One task ready for lm-eval: its config (local data) and item names."""

    name: str
    config: dict[str, Any]
    data_file: Path
    item_ids: list[str]
    split: str
    source: str


def _write_subset(source: Path, rows: list[int], target: Path) -> None:
    with open(source) as handle:
        lines = handle.readlines()
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, suffix=".tmp")
    with os.fdopen(fd, "w") as out:
        out.writelines(lines[i] for i in rows)
    os.chmod(tmp, 0o644)
    os.replace(tmp, target)


def build(task: str, cache_dir: str | Path | None = None, subset: int | None = None,
          seed: int = 0) -> BenchmarkTask:
    """lm-eval's config for `task` over the installed split, or over its seeded subset of `subset` rows."""
    check_task_names([task])
    entry = benchmarks.manifest(cache_dir).get(task) or {}
    full = benchmarks.data_file(task, cache_dir)
    rows = subset_rows(task, int(entry["rows"]), subset, seed)
    ids = [f"{task}:{i}" for i in rows]
    data = full
    if len(rows) < int(entry["rows"]):
        data = full.parent / "subsets" / f"{task}-{len(rows)}-seed{seed}-{ids_hash(ids)}.jsonl"
        if not data.exists():
            _write_subset(full, rows, data)
    return BenchmarkTask(task, with_local_data(lm_eval_config(task), data), data, ids, entry["split"],
                         entry["source"])
