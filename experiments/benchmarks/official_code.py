"""Running an official pruning repository's code on the CPU with transformers 5, unedited.

Most official repositories are Wanda-style scripts written for CUDA and transformers 4. Their
files are copied, as committed, from a fetched mirror (`git show`) into a temporary package and
imported there; what they need from a GPU machine and from transformers 4 is shimmed from
outside, never by editing them:
- `lib.data.get_loaders` (which downloads C4) is a stub returning the given calibration token ids
  as `[(ids[i:i+1], None), ...]`;
- `torch.cuda.empty_cache` and `torch.cuda.synchronize` are no-ops, `Tensor.cuda` the identity, and, with `cuda_to_cpu`,
  `Tensor.to` maps any CUDA device to the CPU (RIA's assignment runs on a hard-coded "cuda:7");
- each decoder layer gets a forward pre-hook computing `position_embeddings` from the model's
  rotary embedding when absent (transformers 5 layers need it; the official loops pass
  `position_ids` only);
- `model.seqlen` and `model.hf_device_map` (`{}`: one device) are set, as their `get_llm` does.

A width-pruned model's kept heads and channels are read back here too (`kept_units`), by matching
its rows to the dense model's: the official width code returns no masks.
"""

from __future__ import annotations

import argparse
import platform
import subprocess
import sys
import types
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch


def official_copy(repo: Path, files: Iterable[str], into: Path) -> Path:
    """The official `files` (paths in the repository), as committed at HEAD, under `into`."""
    for name in files:
        text = subprocess.run(["git", "--git-dir", str(repo), "show", f"HEAD:{name}"], check=True,
                              capture_output=True, text=True).stdout
        (into / name).parent.mkdir(parents=True, exist_ok=True)
        (into / name).write_text(text)
    return into


@contextmanager
def cpu_shims(model, token_ids: torch.Tensor, cuda_to_cpu: bool = False) -> Iterator[None]:
    """Everything a Wanda-style official script needs on a CPU with transformers 5 (module doc)."""
    data = types.ModuleType("lib.data")
    data.get_loaders = lambda *a, **k: ([(token_ids[i:i + 1], None) for i in range(token_ids.shape[0])], None)
    sys.modules["lib.data"] = data
    rotary = model.model.rotary_emb

    def add_position_embeddings(_layer, args, kwargs):
        if kwargs.get("position_embeddings") is None:
            hidden = args[0] if args else kwargs["hidden_states"]
            positions = kwargs.get("position_ids")
            if positions is None:
                positions = torch.arange(hidden.shape[1]).unsqueeze(0)
            kwargs["position_embeddings"] = rotary(hidden, positions)
        return args, kwargs

    handles = [layer.register_forward_pre_hook(add_position_embeddings, with_kwargs=True)
               for layer in model.model.layers]
    model.seqlen = token_ids.shape[1]
    model.hf_device_map = {}
    saved = torch.cuda.empty_cache, torch.cuda.synchronize, torch.Tensor.cuda, torch.Tensor.to
    move = saved[3]

    def to_cpu_instead(self, *args, **kwargs):
        args = tuple("cpu" if _is_cuda(a) else a for a in args)
        if _is_cuda(kwargs.get("device")):
            kwargs["device"] = "cpu"
        return move(self, *args, **kwargs)

    torch.cuda.empty_cache = lambda: None
    torch.cuda.synchronize = lambda *a, **k: None  # SparseGPT's and ALPS's solvers call it
    torch.Tensor.cuda = lambda self, *a, **k: self
    if cuda_to_cpu:
        torch.Tensor.to = to_cpu_instead
    try:
        yield
    finally:
        torch.cuda.empty_cache, torch.cuda.synchronize, torch.Tensor.cuda, torch.Tensor.to = saved
        for handle in handles:
            handle.remove()
        for name in [n for n in sys.modules if n == "lib" or n.startswith("lib.")]:
            del sys.modules[name]


def _is_cuda(value) -> bool:
    return (isinstance(value, str) and value.startswith("cuda")) or (
        isinstance(value, torch.device) and value.type == "cuda")


@contextmanager
def importable(folder: Path) -> Iterator[None]:
    """`folder` first on sys.path while inside (the official package `lib` imports from there)."""
    sys.path.insert(0, str(folder))
    try:
        yield
    finally:
        sys.path.remove(str(folder))


def kept_rows(pruned: torch.Tensor, dense: torch.Tensor) -> list[int]:
    """Index in `dense` ([n, C]) of each row of `pruned` ([k, C]), matched exactly."""
    where = {row.numpy().tobytes(): i for i, row in enumerate(dense)}
    return [where[row.numpy().tobytes()] for row in pruned]


def kept_units(model, dense, head_dim: int) -> tuple[list[list[int]], list[list[int]]]:
    """Per layer, the kept heads (from q_proj's rows) and channels (from gate_proj's) of a
    width-pruned `model` against the `dense` model it was pruned from."""
    heads, channels = [], []
    for layer, dense_layer in zip(model.model.layers, dense.model.layers):
        rows = kept_rows(layer.self_attn.q_proj.weight.data, dense_layer.self_attn.q_proj.weight.data)
        heads.append(sorted({r // head_dim for r in rows}))
        channels.append(kept_rows(layer.mlp.gate_proj.weight.data, dense_layer.mlp.gate_proj.weight.data))
    return heads, channels


def differing(ours: list[list[int]], theirs: list[list[int]]) -> int:
    """Units kept by one side and not the other, summed over layers."""
    return sum(len(set(a) ^ set(b)) for a, b in zip(ours, theirs))


def comparison_parser(description: str, repo_option: str) -> argparse.ArgumentParser:
    """The options every official-code comparison takes: the fetched repository's git dir, where the
    table goes, the calibration size, torch threads, and rendering the committed csv only."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument(repo_option, type=Path, help="git dir of the fetched official repository")
    parser.add_argument("--out", type=Path, default=Path("results/benchmarks"))
    parser.add_argument("--nsamples", type=int, default=32)
    parser.add_argument("--seqlen", type=int, default=256)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--render-only", action="store_true")
    return parser


def render_committed(csv: Path, md: Path, render: Callable[..., str], extra_start: str) -> None:
    """--render-only: rewrite `md` from the committed `csv` with `render(table, header, extra)`,
    keeping the markdown's first paragraph (the header) and its measured lines from `extra_start`."""
    import pandas as pd

    header, _, rest = md.read_text().partition("\n\n")
    extra = rest[rest.find(extra_start):] if extra_start in rest else ""
    md.write_text(render(pd.read_csv(csv), header, extra))
    print(md.read_text())


def comparison_header(what: str, args: argparse.Namespace, setting: str = "") -> str:
    """The table's title: what is compared, on which calibration, machine and torch."""
    return (f"{what}: SmolLM2-135M, all 30 layers, realtext calibration {args.nsamples} x {args.seqlen} "
            f"tokens (seed 0){setting}; fp32, CPU ({platform.machine()}), torch {torch.__version__}, "
            f"{args.threads} thread(s)")


def render_mask_table(table, columns: dict[str, str], header: str, notes: str,
                      counts: tuple[str, ...] = ("differing entries", "total entries")) -> str:
    """A mask comparison's markdown: counts with thousands separators, pruned fractions to 6
    places, seconds to 1."""
    shown = table[list(columns)].rename(columns=columns).copy()
    for column in counts:
        shown[column] = shown[column].map(lambda n: f"{int(n):,}")
    for column in ("pruned (prunelab)", "pruned (official)"):
        shown[column] = shown[column].map(lambda f: f"{f:.6f}")
    for column in ("prunelab s", "official s"):
        shown[column] = shown[column].map(lambda s: f"{s:.1f}")
    return f"# {header}\n\n{shown.to_markdown(index=False)}\n\n{notes}\n{SECONDS_NOTE}"


SECONDS_NOTE = """`prunelab s` and `official s` are wall times of the two runs one after the other in one
process on a shared machine: a record of what each took, not a speed comparison (the official
code is not written for the CPU)."""
