"""Benchmark: wall time and peak memory of Wanda and SparseGPT, stage by stage.

On testbed_llama and on a randomly initialised Llama of about 1B parameters (TinyLlama-1.1B's shape,
fp32 on CPU, a few calibration samples). The peak RSS increase over the loaded model is compared
with the layer-sequential bound: one layer + two activation buffers + the method's per-layer state.

    python experiments/benchmarks/prune_benchmark.py --out results/benchmarks
"""

from __future__ import annotations

import argparse
import gc
import platform
import tempfile
from pathlib import Path

import pandas as pd
import torch

from prunelab.benchmark import StageMeasurements, keep_unmeasured_rows, layer_sequential_bound
from prunelab.context import PruneContext
from prunelab.data import CalibrationSpec, calibration_samples
from prunelab.models import ModelSpec, load_model
from prunelab.pruning.sparsegpt import SparseGPT
from prunelab.pruning.wanda import Wanda

ONE_B = dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
             num_key_value_heads=4, max_position_embeddings=2048, vocab_size=32000)


def random_llama_1b(directory: Path) -> Path:
    """Save a randomly initialised ~1.1B Llama with the testbed tokenizer (weights only matter)."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    with torch.device("meta"):
        model = LlamaForCausalLM(LlamaConfig(**ONE_B))
    model = model.to_empty(device="cpu")
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.02)
    model.save_pretrained(directory, safe_serialization=True)
    tokenizer = AutoTokenizer.from_pretrained(load_model(ModelSpec("testbed_llama")).source)
    tokenizer.save_pretrained(directory)
    return directory


def bench(label: str, spec: ModelSpec, method_name: str, nsamples: int, seqlen: int,
          measurements: StageMeasurements) -> None:
    gc.collect()
    with measurements.stage("load", model=label, method=method_name):
        loaded = load_model(spec)
    calib = CalibrationSpec(source="testbed", nsamples=nsamples, seqlen=seqlen)
    with measurements.stage("calibration_data", model=label, method=method_name):
        samples = calibration_samples(calib, loaded.tokenizer, seed=0)
    method = Wanda() if method_name == "wanda" else SparseGPT()
    ctx = PruneContext(loaded, 0, lambda: samples, progress=True)
    with measurements.stage("allocate", model=label, method=method_name):
        targets = method.allocate(ctx)
    with measurements.stage("prune", model=label, method=method_name):
        method.prune(ctx, targets)
    widest = max(loaded.config.hidden_size, loaded.config.intermediate_size)
    hessians = 0 if method_name == "wanda" else 4 * 4 * widest * widest  # H + Cholesky work copies
    bound = layer_sequential_bound(loaded.model, loaded.adapter.layers, nsamples, seqlen,
                                   loaded.config.hidden_size, hessians)
    measurements.rows[-1].update({f"bound_{k}": v for k, v in bound.items()},
                                 params_m=sum(p.numel() for p in loaded.model.parameters()) / 1e6)
    del loaded, ctx, method
    gc.collect()


def render(table: pd.DataFrame) -> str:
    """Markdown of all stages and of the prune stage against the layer-sequential bound.

    `from_pretrained` memory-maps safetensors, so the weights are paged in while the prune stage
    first touches them: the stage's RSS increase is compared with the whole bound (weights + one
    layer + two activation buffers + method state), which is what the method may hold at once.
    """
    prune = table[table["stage"] == "prune"].copy()
    prune["within_bound"] = prune["rss_increase_mb"] <= prune["bound_bound_mb"]
    cols = ["model", "method", "params_m", "seconds", "rss_start_mb", "rss_peak_mb", "rss_increase_mb",
            "bound_weights_mb", "bound_one_layer_mb", "bound_activation_buffers_mb", "bound_method_state_mb",
            "bound_bound_mb", "within_bound"]
    return (f"# Pruning benchmark ({platform.processor() or platform.machine()}, "
            f"{torch.get_num_threads()} threads, fp32, CPU)\n\nAll stages:\n\n"
            + table.to_markdown(index=False, floatfmt=".1f")
            + "\n\nPrune stage against the layer-sequential bound (weights are memory-mapped and paged in "
              "during the stage, so the stage's RSS increase must stay within weights + one layer + two "
              "activation buffers + method state):\n\n"
            + prune[cols].to_markdown(index=False, floatfmt=".1f") + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("results/benchmarks"))
    parser.add_argument("--skip-1b", action="store_true",
                        help="measure testbed_llama only; keep the 1.1B rows already in the CSV")
    parser.add_argument("--render-only", action="store_true", help="rewrite the markdown from the CSV")
    args = parser.parse_args()
    torch.set_num_threads(2)
    if args.render_only:
        text = render(pd.read_csv(args.out / "prune_benchmark.csv"))
        (args.out / "prune_benchmark.md").write_text(text)
        print(text)
        return 0
    measurements = StageMeasurements()
    for method in ("wanda", "sparsegpt"):
        bench("testbed_llama", ModelSpec("testbed_llama", device="cpu"), method, 32, 256, measurements)
    if not args.skip_1b:
        with tempfile.TemporaryDirectory() as tmp:
            path = random_llama_1b(Path(tmp) / "llama_1b")
            for method in ("wanda", "sparsegpt"):
                bench("random_llama_1.1b", ModelSpec(str(path), device="cpu"), method, 4, 128, measurements)
    table = pd.DataFrame(measurements.rows)
    if args.skip_1b:  # keep the committed 1.1B rows
        table = keep_unmeasured_rows(table, args.out / "prune_benchmark.csv")
    args.out.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out / "prune_benchmark.csv", index=False)
    text = render(table)
    (args.out / "prune_benchmark.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
