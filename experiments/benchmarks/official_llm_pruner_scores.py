"""How close prunelab's LLM-Pruner scores are to the official code's, and how far the cut is from a tie.

The selection comparison is experiments/benchmarks/official_llm_pruner.py (0 differing units); this
records why it holds and how robust it is. Same model, shims and calibration (SmolLM2-135M's exact
multi-head rewrite, rope base set, 10 x 64 realtext tokens in one batch, float32, all 30 layers,
ratio 0.25). A read-only spy keeps every group importance the official `TaylorImportance` /
`MagnitudeImportance` returns (per channel; summed per 64 channels into heads as its
`consecutive_groups` does); prunelab's are `LLMPruner.score`'s. Reported per importance: the
largest relative difference of a head's and a channel's score, how many layers' scores are equal
bit for bit, and the smallest relative gap, over layers, between the last removed and the first
kept unit of prunelab's scores (a difference in scores above it could change a selection).

    python experiments/benchmarks/official_llm_pruner_scores.py   # ~3 min, 2 threads
"""

from __future__ import annotations

import copy
import sys
import tempfile
import types
from pathlib import Path

import pandas as pd
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import official_llm_pruner as benchmark  # noqa: E402
from official_code import importable  # noqa: E402
from oracles.compare import load_smollm2, realtext_calibration, with_model  # noqa: E402

from prunelab.context import PruneContext  # noqa: E402
from prunelab.models.adapter import ModelAdapter  # noqa: E402
from prunelab.models.width import to_multi_head  # noqa: E402
from prunelab.pruning.llm_pruner import LLMPruner  # noqa: E402

SETTINGS = {"taylor param_first": ("taylor", {}), "l2": ("l2", {"importance": "l2"})}


def smallest_margin(scores: torch.Tensor, removed: int) -> float:
    """(first kept - last removed) / |first kept| of one layer's unit scores."""
    ordered = torch.sort(scores)[0]
    return ((ordered[removed] - ordered[removed - 1]) / ordered[removed].abs()).item()


def main() -> int:
    torch.set_num_threads(2)
    loaded = load_smollm2()
    dense = loaded.model.float().eval()
    rope_base = dense.config.rope_parameters["rope_theta"]
    to_multi_head(ModelAdapter(dense))
    ids = realtext_calibration(loaded.tokenizer, 10, 64, seed=0)
    rows = []
    for setting, (pruner, keywords) in SETTINGS.items():
        ctx = PruneContext(with_model(loaded, copy.deepcopy(dense)), 0, lambda: ids, batch_size=10, progress=False)
        plan = LLMPruner(layer_start=0, layer_end=None, **keywords).score(ctx)
        with tempfile.TemporaryDirectory() as tmp, importable(Path(tmp)):
            benchmark.copy_files(benchmark.REPO, benchmark.official_files(benchmark.REPO), Path(tmp))
            for name in benchmark.UNUSED_PACKAGES:
                sys.modules[name] = types.ModuleType(name)
            from LLMPruner.models.hf_llama import modeling_llama  # noqa: PLC0415
            from LLMPruner.pruner import hf_llama_pruner  # noqa: PLC0415

            cls = hf_llama_pruner.TaylorImportance if pruner == "taylor" else hf_llama_pruner.MagnitudeImportance
            call, returned = cls.__call__, []

            def spy(self, group, *args, _call=call, _returned=returned, **kwargs):
                result = _call(self, group, *args, **kwargs)
                _returned.append(result.clone())
                return result

            theirs = benchmark.official_model(modeling_llama, dense, rope_base)
            with benchmark.patched((cls, "__call__", spy)):
                benchmark.run_official(Path(tmp), theirs, ids, 0.25, pruner, "param_first", range(30))
            for name in [m for m in sys.modules if m.startswith("LLMPruner")]:
                del sys.modules[name]
        heads = [s.view(-1, 64).sum(1) for s in returned if s.numel() == 576]  # layer order
        channels = [s for s in returned if s.numel() == 1536]
        rows.append({
            "setting": setting,
            "max rel dscore (heads)": max(((h - plan.attention[i]).abs() / h.abs()).max().item()
                                          for i, h in enumerate(heads)),
            "max rel dscore (channels)": max(((c - plan.mlp[i]).abs() / c.abs()).max().item()
                                             for i, c in enumerate(channels)),
            "layers bit-equal (heads, channels)": (f"{sum(torch.equal(h, plan.attention[i]) for i, h in enumerate(heads))}, "
                                                   f"{sum(torch.equal(c, plan.mlp[i]) for i, c in enumerate(channels))}"),
            "smallest rel margin (heads)": min(smallest_margin(plan.attention[i], 2) for i in range(30)),
            "smallest rel margin (channels)": min(smallest_margin(plan.mlp[i], 384) for i in range(30)),
        })
        print(rows[-1], flush=True)
    table = pd.DataFrame(rows)
    for column in table.columns[1:]:
        if column.startswith(("max", "smallest")):
            table[column] = table[column].map(lambda v: f"{v:.3g}")
    out = Path("results/benchmarks/official_llm_pruner_scores.md")
    out.write_text("# LLM-Pruner scores: prunelab against the official code (SmolLM2-135M multi-head rewrite, "
                   "10 x 64 realtext tokens, float32, 30 layers, ratio 0.25)\n\n"
                   + table.to_markdown(index=False, disable_numparse=True) + "\n\n" + __doc__.split("\n\n")[1] + "\n")
    print(out.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
