"""lm-eval's own standard tasks (boolq, rte, hellaswag, ..., lambada_openai, mmlu) over the offline
copy of their splits.

Each task config is lm-eval's installed YAML (prompt, choices, target, metric list, version,
`process_docs`), loaded with lm-eval's YAML loader; only the data source changes: the hub dataset is
replaced by the JSON lines `prunelab install-data` wrote (`prunelab.data.benchmarks`), given by
absolute path (lm-eval resolves relative `data_files` against the working directory).

A subset (`evaluation.zeroshot.subset: N`, for CPU runs) is N row indices drawn without
replacement by a generator seeded with the data version, the task and `subset_seed`, kept in the
published order: the same items every run. It is written as its own JSON lines file, so lm-eval
(and the equality test, which runs lm-eval's unmodified task on that file) sees only those docs.
Items are named `<task>:<row index in the published split>`; the record stamps a hash of the names.

`mmlu` is lm-eval's group: its 57 subject tasks `mmlu_<subject>` (each also a task name of its own),
each over its subject's rows, with the subject's dev split as lm-eval's `fewshot_split` (its
`first_n` sampler takes the first `num_fewshot` rows: the papers' 5-shot). The group's items are
every subject's, named `mmlu_<subject>:<row in that subject's test split>`, a subset drawn over all
14,042 of them; its score is the mean over those items, as lm-eval's group aggregates acc (weighted
by size).
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
    "lambada_openai": benchmarks.LAMBADA_YAML,
    **{f"mmlu_{subject}": f"mmlu/default/mmlu_{subject}.yaml" for subject in benchmarks.MMLU_SUBJECTS},
}
#: lm-eval groups run as one task: name -> (its YAML, its member tasks in order)
GROUPS: dict[str, tuple[str, tuple[str, ...]]] = {
    "mmlu": ("mmlu/default/_mmlu.yaml", tuple(f"mmlu_{subject}" for subject in benchmarks.MMLU_SUBJECTS)),
}
TASKS: tuple[str, ...] = (*LM_EVAL_YAML, *GROUPS)
_NAMED = (*(t for t in TASKS if not t.startswith("mmlu_")), "mmlu_<subject>")  # for messages
_SPLIT_KEYS = ("training_split", "validation_split", "test_split", "fewshot_split")


def check_task_names(names: list[str] | tuple[str, ...], others: tuple[str, ...] = ()) -> None:
    """A ConfigError (one line, with the closest names) for a name that is no offline task."""
    known = (*TASKS, *others)
    for name in names:
        if name not in known:
            close = difflib.get_close_matches(name, known, n=3)
            hint = f"did you mean {', '.join(close)}? " if close else ""
            raise ConfigError(f"unknown zero-shot task {name!r}; {hint}available offline: {', '.join(_NAMED)}")


def members(task: str) -> tuple[str, ...]:
    """The lm-eval tasks `task` runs: a group's members, else the task itself."""
    return GROUPS[task][1] if task in GROUPS else (task,)


def data_key(task: str) -> str:
    """The installed split (`prunelab.data.benchmarks.BENCHMARKS`) holding `task`'s rows."""
    return "mmlu" if task in GROUPS or task.startswith("mmlu_") else task


def fewshot_key(task: str) -> str | None:
    """The installed few-shot split of `task` (MMLU's dev split), or None: zero-shot only."""
    return benchmarks.FEWSHOT_SPLITS.get(data_key(task))


def row_ranges(task: str) -> list[tuple[str, int, int]]:
    """(lm-eval task, its first row in the installed file, its rows) for each member of `task`."""
    if data_key(task) != "mmlu":
        return [(task, 0, benchmarks.BENCHMARKS[task].rows)]
    offsets = benchmarks.mmlu_offsets()
    return [(m, offsets[m[len("mmlu_"):]], benchmarks.MMLU_TEST_ROWS[m[len("mmlu_"):]]) for m in members(task)]


def item_rows(task: str, size: int | None, seed: int) -> list[tuple[str, int]]:
    """(lm-eval task, row in its split) of each item of `task`'s seeded subset (all items when `size` is
    None), in order; a group's subset is drawn over all its members' items together."""
    ranges = row_ranges(task)
    chosen = subset_rows(task, sum(rows for _, _, rows in ranges), size, seed)
    out, at, start = [], 0, 0
    for name, _, rows in ranges:
        while at < len(chosen) and chosen[at] < start + rows:
            out.append((name, chosen[at] - start))
            at += 1
        start += rows
    return out


def item_ids(task: str, size: int | None, seed: int) -> list[str]:
    """The item names `<lm-eval task>:<row>` of `task`'s subset (known without the data)."""
    return [f"{name}:{row}" for name, row in item_rows(task, size, seed)]


def lm_eval_config(task: str) -> dict[str, Any]:
    """lm-eval's installed config for `task` (includes merged, `!function`s resolved), unmodified; for a
    group (`mmlu`), its first member's."""
    import lm_eval.tasks
    from lm_eval.tasks._yaml_loader import load_yaml

    task = members(task)[0]
    path = Path(lm_eval.tasks.__file__).parent / LM_EVAL_YAML[task]
    config = load_yaml(path, resolve_func=True)
    if config.get("task") != task:
        raise ConfigError(f"lm-eval's {path} no longer defines task {task!r} (found {config.get('task')!r}); "
                          "update prunelab.evaluation.benchmark_tasks.LM_EVAL_YAML")
    return config


def group_version(task: str) -> str | None:
    """lm-eval's version of the group `task` (its group YAML's), None for a single task."""
    if task not in GROUPS:
        return None
    import lm_eval.tasks
    from lm_eval.tasks._yaml_loader import load_yaml

    config = load_yaml(Path(lm_eval.tasks.__file__).parent / GROUPS[task][0], resolve_func=False)
    if config.get("group") != task:
        raise ConfigError(f"lm-eval's {GROUPS[task][0]} no longer defines group {task!r}")
    return version(config)


def with_local_data(config: dict[str, Any], data_file: Path, fewshot_file: Path | None = None) -> dict[str, Any]:
    """`config` with its hub dataset replaced by `data_file` (absolute) as its (test) split, and
    `fewshot_file` (if given) as its `fewshot_split`, kept under lm-eval's name for it."""
    out = {k: v for k, v in config.items() if k not in ("tag", "dataset_name", *_SPLIT_KEYS)}
    files = {"test": str(Path(data_file).resolve())}
    if fewshot_file is not None:
        files[config["fewshot_split"]] = str(Path(fewshot_file).resolve())
        out["fewshot_split"] = config["fewshot_split"]
    out.update(dataset_path="json", dataset_kwargs={"data_files": files}, test_split="test")
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
    """One task ready for lm-eval: its config (local data) and item names; a group (`mmlu`) holds its
    members with items in `parts` (its own config is its first member's, its item names all of theirs)."""

    name: str
    config: dict[str, Any]
    data_file: Path
    item_ids: list[str]
    split: str
    source: str
    fewshot_file: Path | None = None
    parts: tuple[BenchmarkTask, ...] = ()

    @property
    def members(self) -> tuple[BenchmarkTask, ...]:
        """The lm-eval tasks to run: the group's parts, or this task itself."""
        return self.parts or (self,)


def _write_subset(source: Path | list[str], rows: list[int], target: Path) -> None:
    if isinstance(source, list):
        lines = source
    else:
        with open(source) as handle:
            lines = handle.readlines()
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, suffix=".tmp")
    with os.fdopen(fd, "w") as out:
        out.writelines(lines[i] for i in rows)
    os.chmod(tmp, 0o644)
    os.replace(tmp, target)


def _subject_lines(key: str, cache_dir: str | Path | None) -> dict[str, list[str]]:
    """An installed MMLU split's JSON lines by subject (checked: each subject's rows together)."""
    out: dict[str, list[str]] = {}
    last = None
    with open(benchmarks.data_file(key, cache_dir)) as handle:
        for line in handle:
            subject = json.loads(line)["subject"]
            if subject != last and subject in out:
                raise benchmarks.BenchmarkDataError(f"{key}: the rows of {subject} are not together: run "
                                                    f"`{benchmarks.INSTALL_COMMAND}`")
            out.setdefault(subject, []).append(line)
            last = subject
    return out


def build(task: str, cache_dir: str | Path | None = None, subset: int | None = None,
          seed: int = 0) -> BenchmarkTask:
    """lm-eval's config for `task` over the installed split, or over its seeded subset of `subset` rows;
    an MMLU task's subjects over their own rows, each with its dev split for few-shot examples."""
    check_task_names([task])
    key = data_key(task)
    entry = benchmarks.manifest(cache_dir).get(key) or {}
    full = benchmarks.data_file(key, cache_dir)
    if key != "mmlu":
        rows = subset_rows(task, int(entry["rows"]), subset, seed)
        ids = [f"{task}:{i}" for i in rows]
        data = full
        if len(rows) < int(entry["rows"]):
            data = full.parent / "subsets" / f"{task}-{len(rows)}-seed{seed}-{ids_hash(ids)}.jsonl"
            if not data.exists():
                _write_subset(full, rows, data)
        return BenchmarkTask(task, with_local_data(lm_eval_config(task), data), data, ids, entry["split"],
                             entry["source"])
    tests = _subject_lines("mmlu", cache_dir)
    shots = _subject_lines(benchmarks.FEWSHOT_SPLITS["mmlu"], cache_dir)
    chosen: dict[str, list[int]] = {}
    for name, row in item_rows(task, subset, seed):
        chosen.setdefault(name, []).append(row)
    parts = []
    folder = full.parent / "subsets"
    for name, rows in chosen.items():
        subject = name[len("mmlu_"):]
        if len(tests.get(subject, ())) != benchmarks.MMLU_TEST_ROWS[subject]:
            raise benchmarks.BenchmarkDataError(f"{full}: {len(tests.get(subject, ()))} rows of {subject}, expected "
                                                f"{benchmarks.MMLU_TEST_ROWS[subject]}: run "
                                                f"`{benchmarks.INSTALL_COMMAND}`")
        ids = [f"{name}:{i}" for i in rows]
        data = folder / f"{name}-{len(rows)}-seed{seed}-{ids_hash(ids)}.jsonl"
        if not data.exists():
            _write_subset(tests[subject], rows, data)
        shot_file = folder / f"{name}-{benchmarks.FEWSHOT_SPLITS['mmlu']}.jsonl"
        if not shot_file.exists():
            _write_subset(shots[subject], list(range(len(shots[subject]))), shot_file)
        parts.append(BenchmarkTask(name, with_local_data(lm_eval_config(name), data, shot_file), data, ids,
                                   entry["split"], entry["source"], shot_file))
    if task in GROUPS:
        return BenchmarkTask(task, parts[0].config, full, [i for p in parts for i in p.item_ids], entry["split"],
                             entry["source"], None, tuple(parts))
    return parts[0]
