"""Benchmark: prunelab's LLM-Pruner against the official code's block-wise path.

The official `hf_prune.py` (horseee/LLM-Pruner) is run as a script, unedited, from a temporary copy
of it and of its `LLMPruner` package (read from the fetched mirror with `git show`), with the
README's LLaMA flags except the layer range (`--block_wise --pruning_ratio R --pruner_type P
--taylor T --device cpu --eval_device cpu`, attention and MLP layers 0..29: all 30 layers of
SmolLM2-135M; and prunelab's default range 4..27 once). Shims, all outside its files (the attributes are put back afterwards):
- `LlamaForCausalLM.from_pretrained` of its own modeling file returns the model built here from
  that file's class: SmolLM2-135M's exact multi-head rewrite (`models.width.to_multi_head`: each
  key/value head repeated for its 3 query heads) with the dense weights loaded, and each
  attention's rotary embedding rebuilt by that file's own `LlamaRotaryEmbedding` with SmolLM2's
  rope base (the file hard-codes 10000 whatever the config says); its logits are checked against
  prunelab's model (`max abs dlogits`);
- `transformers.LlamaTokenizer.from_pretrained` returns a stand-in (the tokenizer is only used by
  the shimmed calibration and evaluation);
- `LLMPruner.datasets.example_samples.get_examples` (which downloads bookcorpus) returns the same
  calibration token ids prunelab gets (realtext, 10 x 64 tokens as the official 10 x 64);
- `LLMPruner.evaluator.ppl.PPLMetric` (wikitext2 and ptb downloads, after pruning) returns {};
- `torch.cuda.empty_cache` is a no-op and `torch.cuda.memory_allocated` 0 (CPU build);
- its logger writes under a temporary working directory;
- the ChatGLM and Baichuan model packages (imported by `LLMPruner/models/__init__.py`, never used
  by the LLaMA path; their tokenizers need sentencepiece and transformers 4) are empty modules.
The vendored torch_pruning (dependency graph, MetaPruner) needed no shim on torch 2.13.
A spy around the official `TaylorImportance.__call__` / `MagnitudeImportance.__call__` records
each group's members in order (read only). prunelab runs `pruning=llm_pruner` with the same
settings on the transformers 5 model (the same layers, the calibration in one batch).
Both float32 on the CPU. The kept heads and channels are read back from the pruned weights (each
kept row of q_proj and gate_proj matched to its dense row).

    python experiments/benchmarks/official_llm_pruner.py   # a few minutes, 2 threads
    python experiments/benchmarks/official_llm_pruner.py --render-only
"""

from __future__ import annotations

import copy
import platform
import sys
import time
from pathlib import Path

import pandas as pd
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))  # the `oracles` package
sys.path.insert(0, str(Path(__file__).resolve().parent))

from faithful_width import (  # noqa: E402
    largest_differences, multi_head_setup, width_comparison_parser, width_table_markdown,
)
from official_code import differing, kept_units, render_committed  # noqa: E402
from official_runs import hf_prune, llm_pruner_copy, official_model  # noqa: E402

import prunelab  # noqa: E402

REPO = Path("/work/.mirror/horseee+LLM-Pruner/repo")
SETTINGS = {  # row -> (official --pruner_type, --taylor, prunelab keywords)
    "taylor param_first": ("taylor", "param_first", dict(importance="taylor", taylor="param_first")),
    "taylor vectorize": ("taylor", "vectorize", dict(importance="taylor", taylor="vectorize")),
    "taylor param_second": ("taylor", "param_second", dict(importance="taylor", taylor="param_second")),
    "taylor param_mix": ("taylor", "param_mix", dict(importance="taylor", taylor="param_mix")),
    "l2": ("l2", "param_first", dict(importance="l2")),
    "l1": ("l1", "param_first", dict(importance="l1")),
    # prunelab's defaults (the README's first 4 and last 2 layers kept): official layers 4..27 of 30
    "taylor param_first, layers 4..-2": ("taylor", "param_first", dict(layer_start=4, layer_end=-2)),
}
ALL_LAYERS = dict(layer_start=0, layer_end=None)
EXTRA_START = "\nThe official modeling file"  # the measured lines after the notes
COLUMNS = {"setting": "setting", "ratio": "ratio", "layers": "pruned layers", "heads_kept": "heads kept", "channels_kept": "channels kept",
           "differing_heads": "differing heads", "differing_channels": "differing channels",
           "max_abs_dW": "max abs dW", "params_removed": "params removed", "seconds_prunelab": "prunelab s",
           "seconds_official": "official s"}


def official_switches(ratio: float, pruner: str, taylor: str, layers: range) -> str:
    """hf_prune.py's switches: the README's block-wise LLaMA flags with this layer range."""
    return (f"--pruning_ratio {ratio} --block_wise --block_attention_layer_start {layers.start} "
            f"--block_attention_layer_end {layers.stop} --block_mlp_layer_start {layers.start} "
            f"--block_mlp_layer_end {layers.stop} --pruner_type {pruner} --taylor {taylor}")


NOTES = """How to read it: the multi-head rewrite has 9 heads in each of 30 layers (270) and 1,536 MLP
channels in each (46,080). Every row prunes all 30 layers (official `--block_*_layer_start 0
--block_*_layer_end 30`, prunelab `layer_start=0 layer_end=null`) except the last: prunelab's
defaults `layer_start=4 layer_end=-2` against the official `--block_*_layer_start 4
--block_*_layer_end 28` (the README's 4 / 30 on 32 layers). `differing heads` / `differing
channels`: units kept by one side only, summed over layers. `max abs dW`: the largest difference
of any decoder weight after pruning (shapes must match first); block-wise LLM-Pruner only
slices, so equal selections give equal weights. `params removed`: the fraction of the rewrite's
parameters that went (prunelab's record): int(0.75 x 576) = 432 q_proj rows kept, i.e. 2 of 9
heads and 384 of 1,536 channels removed in every pruned layer. The two sides compute their
gradients with different modeling code (the official file's eager attention, its RMSNorm and
rotary gather, against transformers 5's Llama), so the Taylor scores agree to float32 rounding,
not bit for bit: a differing unit would be a near-tie. The official vendored torch_pruning ran
on torch 2.13 without any shim. Times are CPU float32 on a shared machine, not a speed comparison.
"""


def render(table: pd.DataFrame, header: str, extra: str) -> str:
    return header + "\n\n" + width_table_markdown(table, COLUMNS, ("max abs dW",)) + "\n\n" + NOTES + extra


def main() -> int:
    parser = width_comparison_parser(__doc__, nsamples=10, seqlen=64, ratio=0.25)
    parser.add_argument("--repo", type=Path, default=REPO, help="git directory of horseee/LLM-Pruner")
    parser.add_argument("--settings", nargs="+", choices=list(SETTINGS), default=list(SETTINGS))
    args = parser.parse_args()
    csv, md = args.out / "official_llm_pruner.csv", args.out / "official_llm_pruner.md"
    if args.render_only:
        render_committed(csv, md, render, EXTRA_START)
        return 0
    torch.set_num_threads(args.threads)
    tokenizer, dense, token_ids, commit = multi_head_setup(args, args.repo, torch.float32)
    head_dim = dense.model.layers[0].self_attn.head_dim
    rope_base = dense.config.rope_parameters["rope_theta"]
    num_layers = len(dense.model.layers)
    header = (f"# prunelab against the official LLM-Pruner code ({commit[:7]}, hf_prune.py --block_wise): "
              f"SmolLM2-135M's multi-head rewrite (rope base {rope_base:g}), {num_layers} layers, realtext "
              f"calibration {args.nsamples} x {args.seqlen} tokens (seed {args.seed}) in one batch, ratio "
              f"{args.ratio}; float32, CPU ({platform.processor() or platform.machine()}), torch "
              f"{torch.__version__}, {args.threads} thread(s)")
    args.out.mkdir(parents=True, exist_ok=True)
    rows, extra = [], ""
    with llm_pruner_copy(args.repo) as tmp:
        from LLMPruner.models.hf_llama import modeling_llama  # noqa: PLC0415  (from the copy)

        with torch.no_grad():
            reference = official_model(modeling_llama, dense, rope_base)
            dlogits = (reference(token_ids).logits - dense(input_ids=token_ids).logits).abs().max().item()
        del reference
        extra += (f"{EXTRA_START} with the rope base set computes the same function as prunelab's "
                  f"model: max abs dlogits {dlogits:.3g} on the calibration ids.\n")
        for setting in args.settings:
            pruner, taylor, keywords = SETTINGS[setting]
            ours = copy.deepcopy(dense)
            start = time.perf_counter()
            keywords = {**ALL_LAYERS, **keywords}
            report = prunelab.prune(ours, tokenizer, method="llm_pruner", calibration=token_ids, ratio=args.ratio,
                                    batch_size=token_ids.shape[0], seed=args.seed, progress=False, **keywords)
            layers = report["pruning"]["layers"]
            seconds_ours = time.perf_counter() - start
            theirs = official_model(modeling_llama, dense, rope_base)
            start = time.perf_counter()
            groups = hf_prune(tmp, theirs, token_ids,
                              official_switches(args.ratio, pruner, taylor, range(layers[0], layers[-1] + 1)))
            seconds_theirs = time.perf_counter() - start
            heads, channels = kept_units(ours, dense, head_dim)
            their_heads, their_channels = kept_units(theirs, dense, head_dim)
            rows.append({"setting": setting, "ratio": args.ratio, "layers": f"{layers[0]}..{layers[-1]}", "heads_kept": sum(map(len, heads)),
                         "channels_kept": sum(map(len, channels)),
                         "differing_heads": differing(heads, their_heads),
                         "differing_channels": differing(channels, their_channels),
                         "max_abs_dW": largest_differences(ours, theirs)[0],
                         "params_removed": report["pruning"]["width"]["params_removed"],
                         "seconds_prunelab": seconds_ours, "seconds_official": seconds_theirs})
            print(rows[-1], flush=True)
            if setting == args.settings[0]:
                extra += ("\nThe official groups' members, in its order (layer 0): "
                          + "; ".join(", ".join(m for m in g if ".0." in m or "layers.0" in m) for g in groups[:2])
                          + ".\n")
            del ours, theirs
            table = pd.DataFrame(rows)
            table.to_csv(csv, index=False)
            md.write_text(render(table, header, extra))
    print(md.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
