"""`prunelab-gpu-check`: checks a GPU node, offline, in one command (see the package docstring)."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import tempfile
import time
from pathlib import Path

import torch

from prunelab.gpu_check.checks import (
    check_bfloat16, check_device_agreement, check_families, check_paper_protocol,
)
from prunelab.gpu_check.context import CheckContext, Testbed, sizes_for
from prunelab.gpu_check.families import METHOD_FAMILIES
from prunelab.gpu_check.measure import Row, one_line
from prunelab.gpu_check.memory_checks import check_refusal, check_streamed_under_limit
from prunelab.gpu_check.report import device_facts, summary, table, write_json

#: letter -> (what it checks, the function returning its rows)
CHECKS = {
    "a": ("every method family once on the testbed", check_families),
    "b": ("default Wanda, SparseGPT, magnitude 2:4 against the CPU", check_device_agreement),
    "c": ("a streamed run under a memory limit equals the resident run", check_streamed_under_limit),
    "d": ("a model larger than the limit refused in one line", check_refusal),
    "e": ("bfloat16 against float32", check_bfloat16),
    "f": ("Wanda and SparseGPT on the LLaMA-2-7B shape, 128 x 2048 tokens", check_paper_protocol),
}


def parser() -> argparse.ArgumentParser:
    listed = "\n".join(f"  ({letter}) {words}" for letter, (words, _) in CHECKS.items())
    parse = argparse.ArgumentParser(
        prog="prunelab-gpu-check", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Check a GPU node offline: every method family, the device against the CPU, "
                    "streaming under a memory cap, bfloat16, the papers' protocol on a 7B shape. "
                    "Prints one table, writes one JSON; exit status 1 when a check failed.",
        epilog=f"checks:\n{listed}")
    parse.add_argument("--device", default="auto", help="auto (cuda when available) | cuda | cuda:N | cpu")
    parse.add_argument("--quick", action="store_true", help="the same checks, small (CI: under 3 minutes on 2 cores)")
    parse.add_argument("--output", type=Path, default=Path("gpu_check.json"), help="the JSON report (default: %(default)s)")
    parse.add_argument("--checks", default="".join(CHECKS), help="letters of the checks to run (default: %(default)s)")
    parse.add_argument("--families", default=None,
                       help="comma-separated method families for check (a) (default: all of them)")
    parse.add_argument("--threads", type=int, default=None,
                       help="torch CPU threads (default: 1 with --device cpu, the steadiest on a shared machine; "
                            "torch's own on a GPU node)")
    return parse


def chosen_device(name: str) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"prunelab-gpu-check: --device {name}, but this torch ({torch.__version__}) sees no "
                         "CUDA GPU; --device cpu runs the CPU version of the checks")
    if device.type not in ("cuda", "cpu"):
        raise SystemExit(f"prunelab-gpu-check: --device {name}: use auto, cuda, cuda:N or cpu")
    if device.type == "cuda" and device.index is None:  # the cap's setter and the rows name the card
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def chosen_families(names: str | None) -> list[str]:
    if names is None:
        return list(METHOD_FAMILIES)
    families = [name.strip() for name in names.split(",") if name.strip()]
    unknown = [name for name in families if name not in METHOD_FAMILIES]
    if unknown:
        raise SystemExit(f"prunelab-gpu-check: unknown famil{'y' if len(unknown) == 1 else 'ies'} "
                         f"{', '.join(unknown)}; known: {', '.join(METHOD_FAMILIES)}")
    return families


def run_cli(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    device = chosen_device(args.device)
    letters = [letter for letter in CHECKS if letter in args.checks]
    families = chosen_families(args.families)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    quiet_library_progress_bars()
    sizes = sizes_for(device, args.quick)
    threads, previous = args.threads or (1 if device.type == "cpu" else None), torch.get_num_threads()
    start = time.perf_counter()
    rows = []
    try:
        if threads:  # two threads on two busy cores wait on each other: measured 187 s against 81 s with one
            torch.set_num_threads(threads)
        used_threads = torch.get_num_threads()
        with tempfile.TemporaryDirectory(prefix="prunelab-gpu-check-") as work:
            ctx = CheckContext(device, sizes, Testbed(sizes), Path(work), families)
            for letter in letters:
                rows += rows_of(letter, ctx)
    finally:
        torch.set_num_threads(previous)  # a caller's process (a test) keeps its own
    seconds = time.perf_counter() - start
    print(table(rows))
    facts = device_facts(device)
    options = {"device": args.device, "quick": args.quick, "checks": "".join(letters), "families": families,
               "sizes": dataclasses.asdict(sizes), "torch_threads": used_threads}
    path = write_json(args.output, facts, options, rows, seconds)
    outcome = summary(rows)
    print(f"{outcome['ok']} ok, {outcome['failed']} failed, {outcome['skipped']} skipped in {seconds:.0f} s "
          f"on {facts['device']['name']}; report: {path}")
    return 0 if outcome["passed"] else 1


def rows_of(letter: str, ctx: CheckContext) -> list[Row]:
    """The check's rows; a check that fails before its first row (its calibration, its model) is
    one failed row, and the other checks still run."""
    words, check = CHECKS[letter]
    try:
        return check(ctx)
    except Exception as err:
        return [Row(f"{letter}: {words}", "failed", None, None, one_line(err))]


def quiet_library_progress_bars() -> None:
    """transformers' weight-loading and shard-writing bars would break the one progress line per row."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
