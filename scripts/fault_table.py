"""Fault injection: bad inputs and faults run as `prunelab` subprocesses, each classified.

    python scripts/fault_table.py            # all cases, 2 at a time; prints a markdown table
    python scripts/fault_table.py --jobs 1 --only sig   # cases whose name contains "sig"

Classes:
- clear: exit != 0, no traceback, and exactly one error line on stderr, the last one (progress bars
  and informational log lines such as aggregate's record count aside);
- handled: the fault's right outcome is success (a damaged cache rebuilt, a model saved...), exit 0
  and the case's check of the result passes;
- traceback: a Python traceback was printed;
- silent wrong: exit 0 where an error was due, or the case's check of the result failed (wrong or
  missing result, a record with the wrong status);
- lost: a completed record that existed before the case was replaced or removed (each case
  starts from a copy of one completed records folder and is checked for it).

Tiny settings (shipped testbed model, magnitude pruning, 2 windows, 1 thread, tracking=none,
evaluation=ppl); a shared warm cache. Runs in a few minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

BIN = Path(sys.executable).parent
PRUNELAB = str(BIN / "prunelab")
SHIPPED = Path(__file__).resolve().parents[1] / "src/prunelab/testbed/checkpoints/testbed_llama"
BASE = ["tracking=none", "evaluation=ppl", "runtime.threads=1", "runtime.progress=false",
        "pruning=magnitude", "data.calibration.nsamples=2", "data.calibration.seqlen=32",
        "evaluation.perplexity.seqlen=64", "evaluation.perplexity.max_windows=2"]
SLOW_SCORE = ("import time, sys; from prunelab.pruning.magnitude import Magnitude; "
              "Magnitude.allocate = lambda self, ctx: time.sleep(600); "
              "from prunelab.cli import main; sys.argv[0] = 'prunelab'; main()")
TEXT = "the cat sat on the mat . the dogs that the boy owns are happy . " * 300


@dataclass
class Case:
    name: str
    args: list[str] = field(default_factory=list)
    expect: str = "error"  # error | ok
    env: dict[str, str] = field(default_factory=dict)
    prepare: Callable[["Ctx"], list[str]] | None = None  # extra args, after setting up files
    check: Callable[["Ctx"], str | None] | None = None  # a problem with the result, or None
    interrupt: int | None = None  # signal sent once the (slowed) score stage runs
    shell: str | None = None  # bash prefix, e.g. a file-size limit
    base: bool = True  # prepend BASE


@dataclass
class Ctx:
    root: Path  # this case's folder
    shared: Path  # files shared by all cases

    @property
    def records(self) -> Path:
        return self.root / "records"


# ----------------------------------------------------------------------------- helpers


def run(args: list[str], cwd: Path, env: dict | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=cwd, env={**os.environ, **(env or {})}, capture_output=True,
                          text=True, timeout=timeout)


def records_of(folder: Path, pattern: str = "result.json") -> dict[Path, dict]:
    out = {}
    for path in folder.rglob(pattern):
        try:
            out[path] = json.loads(path.read_text())
        except (OSError, ValueError):
            pass
    return out


def model_copy(ctx: Ctx, edit: Callable[[Path], None]) -> list[str]:
    target = ctx.root / "model"
    shutil.copytree(SHIPPED, target)
    edit(target)
    return [f"model.name_or_path={target}"]


def edit_config(**changes) -> Callable[[Path], None]:
    def edit(folder: Path) -> None:
        config = json.loads((folder / "config.json").read_text())
        for key, value in changes.items():
            if value is None:
                config.pop(key, None)
            else:
                config[key] = value
        (folder / "config.json").write_text(json.dumps(config))
    return edit


def edit_weights(change: Callable[[dict], None]) -> Callable[[Path], None]:
    def edit(folder: Path) -> None:
        from safetensors.torch import load_file, save_file

        tensors = load_file(str(folder / "model.safetensors"))
        change(tensors)
        save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return edit


def truncate(folder: Path) -> None:
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[: len(data) // 3])


def text_file(ctx: Ctx, content: bytes, name: str = "corpus.txt", sub: str = "text") -> Path:
    path = ctx.root / sub / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    return path


def local_text(*paths: Path, eval_paths: tuple[Path, ...] | None = None) -> list[str]:
    evals = eval_paths or paths
    return ["data=local_text", f"data.calibration.paths=[{','.join(map(str, paths))}]",
            f"data.eval_paths=[{','.join(map(str, evals))}]"]


def new_records(ctx: Ctx, status: str | None = None) -> list[dict]:
    """Records written by the case (not in the copied base records)."""
    base = {p.relative_to(ctx.shared / "base_records") for p in records_of(ctx.shared / "base_records")}
    found = [r for p, r in records_of(ctx.records, "result*.json").items()
             if p.relative_to(ctx.records) not in base or r.get("finished_at") != base_finished(ctx)]
    return [r for r in found if status is None or r.get("status") == status]


def base_finished(ctx: Ctx) -> str:
    [record] = records_of(ctx.shared / "base_records").values()
    return record["finished_at"]


def dense_value(record: dict) -> float:
    return next(iter(record["metrics"]["dense"].values()))["value"]


# ----------------------------------------------------------------------------- checks


def status_is(status: str) -> Callable[[Ctx], str | None]:
    def check(ctx: Ctx) -> str | None:
        if not new_records(ctx, status):
            return f"no record with status {status}"
        return None
    return check


def no_half_model(ctx: Ctx) -> str | None:
    leftovers = [p for p in ctx.records.rglob("*") if p.is_dir() and (p.name == "model" or p.name.endswith(".tmp"))]
    return f"half-written model folder left: {leftovers}" if leftovers else None


def model_saved(ctx: Ctx) -> str | None:
    if not list(ctx.records.rglob("model/model*.safetensors")):
        return "save_model=true did not save the model"
    return None


def twins_differ(ctx: Ctx) -> str | None:
    values = sorted(dense_value(r) for r in new_records(ctx, "completed"))
    if len(values) != 2:
        return f"expected two completed records, got {len(values)}"
    return "two different texts got the same dense metric" if values[0] == values[1] else None


def overridden_model_labelled_by_path(ctx: Ctx) -> str | None:
    [record] = new_records(ctx, "completed") or [None]
    if record is None:
        return "no completed record"
    if record["labels"]["model"] == "testbed_llama":
        return "an overridden model is labelled as the preset's model"
    [base] = records_of(ctx.shared / "base_records").values()
    if record.get("model", {}).get("key") == base.get("model", {}).get("key"):
        return "different weights share the model identity"
    return None


def plain_loading_not_silently_wrong(ctx: Ctx) -> str | None:
    code = (
        "import sys, torch\n"
        "from transformers import AutoModelForCausalLM\n"
        "from prunelab.models import ModelSpec, load_model\n"
        "from prunelab.recovery.plain_loading import MARKER_KEY\n"
        "folder = sys.argv[1]; ids = torch.arange(1, 40)[None]\n"
        "plain, info = AutoModelForCausalLM.from_pretrained(folder, output_loading_info=True)\n"
        "ours = load_model(ModelSpec(name_or_path=folder, device='cpu')).model\n"
        "diff = (plain(input_ids=ids).logits - ours(input_ids=ids).logits).abs().max().item()\n"
        "print('OK' if diff < 1e-4 or MARKER_KEY in info['unexpected_keys'] else f'DIFF {diff}')\n")
    folders = list(ctx.records.rglob("model/config.json"))
    if not folders:
        return "no saved model"
    result = run([sys.executable, "-c", code, str(folders[0].parent)], ctx.root)
    return None if result.stdout.strip().endswith("OK") else f"plain loading: {result.stdout[-200:]}"


def cache_rebuilt(kind: str) -> Callable[[Ctx], str | None]:
    def check(ctx: Ctx) -> str | None:
        records = new_records(ctx, "completed")
        if not records:
            return "no completed record"
        [base] = records_of(ctx.shared / "base_records").values()
        if abs(dense_value(records[0]) - dense_value(base)) > 1e-9:
            return f"{kind}: dense metric {dense_value(records[0])} != {dense_value(base)}"
        if (ctx.root / "pwned").exists():
            return "a cache file ran code"
        return None
    return check


# ----------------------------------------------------------------------------- preparations


def private_cache(damage: Callable[[Path], None]) -> Callable[[Ctx], list[str]]:
    def prepare(ctx: Ctx) -> list[str]:
        cache = ctx.root / "cache"
        shutil.copytree(ctx.shared / "cache", cache)
        damage(cache)
        return [f"paths.cache_dir={cache}", "runtime.skip_completed=false"]
    return prepare


def truncate_tokens(cache: Path) -> None:
    for path in (cache / "tokens").glob("*.safetensors"):
        path.write_bytes(path.read_bytes()[:100])


def edit_dense(cache: Path) -> None:
    for path in (cache / "dense").glob("*.json"):
        entry = json.loads(path.read_text())
        for metric in entry["metrics"].values():
            metric["value"] = 1.0
        path.write_text(json.dumps(entry))


def pickle_tokens(cache: Path) -> None:
    import pickle

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {cache.parent / 'pwned'}",))

    for path in (cache / "tokens").glob("*.safetensors"):
        path.write_bytes(pickle.dumps(Evil()))


def twins(ctx: Ctx) -> list[str]:
    a = text_file(ctx, TEXT.replace("cat", "cow").encode(), sub="a")
    b = text_file(ctx, TEXT.replace("cat", "dog").encode(), sub="b")
    for path in (a, b):  # two runs of the same name and size, one per text
        result = run([PRUNELAB, *BASE, *local_text(path), f"paths.records_dir={ctx.records}",
                      f"paths.cache_dir={ctx.root / 'cache'}", f"hydra.run.dir={ctx.root / 'out'}"],
                     ctx.root)
        if result.returncode:
            raise RuntimeError(result.stderr[-500:])
    return ["--version"]  # the case's own command only prints the version


def edit_in_place(ctx: Ctx) -> list[str]:
    path = text_file(ctx, TEXT.encode())
    args = [PRUNELAB, *BASE, *local_text(path), f"paths.records_dir={ctx.root / 'records_first'}",
            f"paths.cache_dir={ctx.root / 'cache'}", f"hydra.run.dir={ctx.root / 'out'}"]
    if run(args, ctx.root).returncode:
        raise RuntimeError("first run failed")
    path.write_bytes(TEXT.replace("cat", "dog").encode())  # same size, same name
    return [*local_text(path), f"paths.cache_dir={ctx.root / 'cache'}"]


def edited_in_place_differs(ctx: Ctx) -> str | None:
    first = list(records_of(ctx.root / "records_first").values())
    second = new_records(ctx, "completed")
    if not first or not second:
        return "missing record"
    return "the edited file reused the old dense metric" if dense_value(first[0]) == dense_value(second[0]) else None


# ----------------------------------------------------------------------------- cases


def cases() -> list[Case]:
    nan = edit_weights(lambda t: t[next(k for k in t if "down_proj" in k)].__setitem__((0, 0), float("nan")))
    inf = edit_weights(lambda t: t[next(k for k in t if "embed" in k)].__setitem__((0, 0), float("inf")))

    def extra_weight(t):
        import torch
        t["model.layers.40.mlp.extra.weight"] = torch.zeros(3)

    def drop_weight(t):
        t.pop(next(k for k in t if "layers.3.mlp.up_proj" in k))

    def model_case(name, edit, **kw):
        return Case(name, prepare=lambda ctx: model_copy(ctx, edit), **kw)

    def text_case(name, content, **kw):
        return Case(name, prepare=lambda ctx: local_text(text_file(ctx, content)), **kw)

    return [
        Case("unknown pruning option", ["pruning=wandaa"]),
        Case("unknown model preset", ["model=lama2_7b"]),
        Case("unknown config key", ["+pruning.typo_key=1"]),
        Case("key not in config (no +)", ["pruning.typo_key=1"]),
        Case("sparsity 1.5", ["pruning.sparsity=1.5"]),
        Case("2:4 with sparsity 0.6", ["pruning=wanda", "pruning.sparsity_type=2:4", "pruning.sparsity=0.6"]),
        Case("negative seed", ["seed=-1"]),
        Case("seed not a number", ["seed=abc"]),
        Case("threads=-1", ["runtime.threads=-1"]),
        Case("threads=0", ["runtime.threads=0"]),
        Case("max_windows=0", ["evaluation.perplexity.max_windows=0"]),
        Case("eval seqlen=1", ["evaluation.perplexity.seqlen=1"]),
        Case("calibration nsamples=0", ["data.calibration.nsamples=0"]),
        Case("calibration seqlen beyond context", ["data.calibration.seqlen=4096"]),
        Case("model path missing", ["model.name_or_path=/no/such/model"]),
        Case("hub model offline", ["model.name_or_path=nobody/no-such-model"], env={"HF_HUB_OFFLINE": "1"}),
        Case("tokenizer path missing", ["model.tokenizer=/no/such/tokenizer"]),
        Case("device=cuda without GPU", ["model.device=cuda"]),
        Case("dtype float8", ["model.dtype=float8"]),
        Case("unknown eval corpus", ["data.eval_corpora=[nope]"]),
        Case("unknown ppl protocol", ["evaluation.perplexity.protocols=[bogus]"]),
        Case("wikitext2 offline", ["data=wikitext2"], env={"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}),
        Case("recovery without depth pruning", ["recovery=linear_patch_d"]),
        Case("depth: more layers than the model", ["pruning=depth", "pruning.num_layers=100"]),
        Case("local text missing", local_text(Path("/no/such.txt"))),
        text_case("local text empty", b""),
        text_case("local text binary", bytes(range(256)) * 10),
        text_case("local text latin-1", "caf\xe9 na\xefve ".encode("latin-1") * 200),
        text_case("local text too short for calibration", b"a few words only"),
        Case("eval text shorter than one window",
             prepare=lambda ctx: local_text(text_file(ctx, TEXT.encode()),
                                            eval_paths=(text_file(ctx, b"tiny text", "short.txt"),))),
        model_case("weights truncated", truncate),
        model_case("config without num_hidden_layers", edit_config(num_hidden_layers=None)),
        model_case("NaN weight", nan),
        model_case("Inf weight", inf),
        model_case("unexpected weight", edit_weights(extra_weight)),
        model_case("missing weight", edit_weights(drop_weight)),
        model_case("config needs more memory than free", edit_config(intermediate_size=10**8)),
        model_case("tokenizer files missing", lambda f: [(f / n).unlink() for n in ("tokenizer.json", "tokenizer_config.json")]),
        model_case("config.json not JSON", lambda f: (f / "config.json").write_text("{oops")),
        Case("records folder not writable", ["runtime.skip_completed=false"],
             prepare=lambda ctx: [f"paths.records_dir={text_file(ctx, b'x', 'file')}/records"]),
        Case("cache folder not writable, rerun of a completed setting", ["runtime.skip_completed=false"],
             prepare=lambda ctx: [f"paths.cache_dir={text_file(ctx, b'x', 'file')}/cache"]),
        Case("SIGINT (Ctrl-C) during a run", ["seed=1"], interrupt=signal.SIGINT,
             check=status_is("interrupted")),
        Case("SIGTERM (SLURM) during a run", ["seed=1"], interrupt=signal.SIGTERM,
             check=status_is("interrupted")),
        Case("SIGTERM during a rerun of a completed setting", ["runtime.skip_completed=false"],
             interrupt=signal.SIGTERM, check=status_is("interrupted")),
        Case("disk full while saving the model", ["save_model=true", "runtime.skip_completed=false"],
             shell="trap '' XFSZ; ulimit -f 1200;", check=no_half_model),
        Case("rerun of a completed setting", ["runtime.skip_completed=false"], expect="ok",
             check=status_is("completed")),
        Case("save_model=true on a completed setting", ["save_model=true"], expect="ok", check=model_saved),
        Case("same-named same-size text files", expect="ok", prepare=twins, check=twins_differ, base=False),
        Case("text file edited in place", expect="ok", prepare=edit_in_place, check=edited_in_place_differs),
        Case("token cache truncated", expect="ok", prepare=private_cache(truncate_tokens),
             check=cache_rebuilt("token cache")),
        Case("dense cache edited", expect="ok", prepare=private_cache(edit_dense),
             check=cache_rebuilt("dense cache")),
        Case("pickle planted in the token cache", expect="ok", prepare=private_cache(pickle_tokens),
             check=cache_rebuilt("planted pickle")),
        Case("model.name_or_path overridden (other weights)", expect="ok",
             prepare=lambda ctx: model_copy(ctx, edit_weights(lambda t: t.__setitem__(
                 "lm_head.weight", t["lm_head.weight"] * 1.01))),
             check=overridden_model_labelled_by_path),
        Case("depth + operators saved, loaded with plain from_pretrained",
             ["pruning=depth", "pruning.num_layers=3", "recovery=linear_patch_d", "save_model=true"],
             expect="ok", check=plain_loading_not_silently_wrong),
        Case("aggregate: no such folder", ["aggregate", "/no/such/records"], base=False),
        Case("aggregate: unknown metric", base=False,
             prepare=lambda ctx: ["aggregate", str(ctx.records), "--metric", "nope", "--out", str(ctx.root / "agg")]),
    ]


# ----------------------------------------------------------------------------- running


def message_lines(stderr: str) -> list[str]:
    """stderr without progress bars and Python warnings' source lines."""
    return [line for line in stderr.splitlines()
            if line.strip() and "it/s]" not in line and "%|" not in line and "s/it]" not in line]


def classify(case: Case, ctx: Ctx, proc: subprocess.CompletedProcess) -> tuple[str, str]:
    before = records_of(ctx.shared / "base_records")
    kept = {r.get("finished_at") for r in records_of(ctx.records, "result*.json").values()}
    if ctx.records.exists() and any(r["finished_at"] not in kept for r in before.values()):
        return "lost", "the completed record was replaced or removed"
    output = proc.stdout + proc.stderr
    lines = message_lines(proc.stderr)
    if "Traceback" in output:
        return "traceback", next((l for l in reversed(lines) if l.strip()), "")[:120]
    problem = case.check(ctx) if case.check else None
    if problem:
        return "silent wrong", problem
    if case.expect == "ok":
        if proc.returncode != 0:
            return "silent wrong", f"exit {proc.returncode}: {(lines or [''])[-1][:120]}"
        return "handled", "exit 0, result checked"
    if proc.returncode == 0:
        return "silent wrong", "exit 0 where an error was due"
    errors = [line for line in lines if "error" in line.lower()]
    if len(errors) == 1 and lines[-1] == errors[0]:
        return "clear", errors[0][:160]
    return "unclear", f"{len(lines)} lines: " + " / ".join(lines)[:160]


def run_case(case: Case, index: int, shared: Path) -> tuple[Case, str, str, float]:
    ctx = Ctx(shared / f"case{index:02d}", shared)
    shutil.copytree(shared / "base_records", ctx.records)
    start = time.perf_counter()
    try:
        extra = case.prepare(ctx) if case.prepare else []
    except Exception as err:  # noqa: BLE001 - a broken preparation is reported, not fatal
        return case, "setup failed", str(err)[:160], time.perf_counter() - start
    if extra[:1] == ["aggregate"] or case.args[:1] == ["aggregate"]:
        args = [PRUNELAB, *case.args, *extra]
    elif extra == ["--version"]:
        args = [sys.executable, "-c", "pass"]
    else:
        args = [PRUNELAB, *(BASE if case.base else []), f"paths.records_dir={ctx.records}",
                f"paths.cache_dir={shared / 'cache'}", f"hydra.run.dir={ctx.root / 'out'}",
                *case.args, *extra]
    if case.interrupt:
        args = [sys.executable, "-c", SLOW_SCORE, *args[1:]]
        process = subprocess.Popen(args, cwd=ctx.root, env={**os.environ, **case.env},
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 300
        while time.time() < deadline and process.poll() is None and not any(
                "stage allocate" in p.read_text() for p in (ctx.root / "out").glob("*.log")):
            time.sleep(0.2)
        process.send_signal(case.interrupt)
        stdout, stderr = process.communicate(timeout=300)
        proc = subprocess.CompletedProcess(args, process.returncode, stdout, stderr)
    elif case.shell:
        command = case.shell + " exec " + " ".join(f"'{a}'" for a in args)
        proc = subprocess.run(["bash", "-c", command], cwd=ctx.root, env={**os.environ, **case.env},
                              capture_output=True, text=True, timeout=600)
    else:
        proc = run(args, ctx.root, case.env)
    kind, detail = classify(case, ctx, proc)
    print(f"[{index + 1}] {case.name}: {kind} ({time.perf_counter() - start:.0f} s)", file=sys.stderr,
          flush=True)
    return case, kind, detail, time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--only", default="", help="run the cases whose name contains this")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    args = parser.parse_args()
    shared = Path(tempfile.mkdtemp(prefix="prunelab-faults-"))
    os.environ.setdefault("WANDB_MODE", "disabled")
    base = run([PRUNELAB, *BASE, f"paths.records_dir={shared / 'base_records'}",
                f"paths.cache_dir={shared / 'cache'}", f"hydra.run.dir={shared / 'base_out'}"], shared)
    if base.returncode:
        print(base.stderr[-2000:], file=sys.stderr)
        return 1
    chosen = [(i, c) for i, c in enumerate(cases()) if args.only.lower() in c.name.lower()]
    with ThreadPoolExecutor(args.jobs) as pool:
        results = list(pool.map(lambda ic: run_case(ic[1], ic[0], shared), chosen))
    print("| # | fault | class | detail |\n|---|---|---|---|")
    totals: dict[str, int] = {}
    for (i, _), (case, kind, detail, seconds) in zip(chosen, results):
        totals[kind] = totals.get(kind, 0) + 1
        print(f"| {i + 1} | {case.name} | {kind} | {detail.replace('|', '/')} ({seconds:.0f} s) |")
    order = ["clear", "handled", "unclear", "traceback", "silent wrong", "lost", "setup failed"]
    print("\n**Totals** (" + str(len(results)) + " cases): "
          + ", ".join(f"{k}: {totals.get(k, 0)}" for k in order))
    if not args.keep:
        shutil.rmtree(shared, ignore_errors=True)
    else:
        print(f"\nkept: {shared}")
    bad = sum(totals.get(k, 0) for k in ("unclear", "traceback", "silent wrong", "lost", "setup failed"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
