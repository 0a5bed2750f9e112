"""`prunelab-gpu-check`: one command that checks a GPU node, offline (issue 35).

It needs no download: the shipped testbed, and randomly initialised models built on the device
from shipped configs (`shapes/`: a LLaMA-2-7B shape and TinyLlama-1.1B's as the 1B shape). It
prints one table and writes one JSON (`--output`), a row per check with ok / failed / skipped,
seconds, peak memory and a one-line detail:

(a) every method family once on the testbed (`families.METHOD_FAMILIES`: unstructured and N:M,
    allocations, depth scorers with recoveries, width);
(b) default Wanda, SparseGPT and magnitude 2:4 on the device against the CPU on the same
    calibration: mask entries that differ and the perplexity difference;
(c) a streamed run under a GPU memory cap (`torch.cuda.set_per_process_memory_fraction`): the
    planner streams, the run fits, the masks equal the resident run's;
(d) a model larger than the cap refused in one line before any weight is read;
(e) bfloat16 against float32;
(f) Wanda and SparseGPT on the 7B shape with the papers' protocol (128 x 2048 tokens): time, peak.

`--device cpu --quick` runs the same checks small (CI, under 3 minutes on 2 cores); on the CPU a
CUDA-only step runs its CPU analogue (a host memory budget instead of the cap; the CPU against
itself in (b)) and its row says so. Exit status 1 when any check failed.
"""

from __future__ import annotations

import os


def main(argv: list[str] | None = None) -> int:
    """The console script. The hub is never asked (HF_HUB_OFFLINE): a node without network must
    not wait on it."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from prunelab.gpu_check.cli import run_cli

    return run_cli(argv)
