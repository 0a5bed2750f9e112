"""Benchmark: prunelab's SliceGPT against the official code (microsoft/TransformerCompression) on
SmolLM2-135M, all 30 layers.

The official `run_slicegpt.py` cannot load SmolLM2 (its Llama adapter accepts only model names
starting `meta-llama/Llama-2` or `meta-llama/Meta-Llama-3`, and it downloads wikitext2), so its
steps are replayed here with the official library functions, from a temporary copy of the
`src/slicegpt` package (read from the fetched mirror with `git show`, never edited), on a deep copy
of the dense model prunelab loads (`smollm2_135m`, float32), by `official_runs.slicegpt_slice`
(which `user_conditions.py` runs too):
- `adapters.llama_adapter.LlamaModelAdapter(model)` with what `_from_pretrained` and
  `hf_utils.get_model_and_tokenizer` set (`config.torch_dtype` float32, i.e. `--dtype fp32`;
  `model.seqlen`; `eval()`; `use_cache = False`);
- `layernorm_fusion.replace_layers(adapter)`, then `layernorm_fusion.fuse_modules(adapter)`;
- d = int((1 - sparsity) * 576), minus d % 8 (`--round-interval 8`), `ConstSlicingScheduler(d)`
  (head not sliced);
- `rotate.rotate_and_slice(adapter, loader, scheduler, final_orientation=...)` with its default
  `apply_mask=True`; `loader` a torch DataLoader of the same calibration token ids prunelab gets
  (realtext, 32 x 256, seed 0) in order, in batches of 16 (`--cal-batch-size 16`), each batch
  `input_ids`, `attention_mask` (all ones) and `labels` as `data_utils.prepare_dataloader` gives;
- `--final-orientation random` (the official default) draws from the global `np.random`, which the
  script never seeds: here `np.random.seed(0)` right before `rotate_and_slice`, the seed prunelab's
  `RandomState` gets (the run's seed, 0).
Shims, all outside its files (hooks on the official copy's modules, discarded with it):
- `ml_collections` (imported by `slicegpt/config.py` for a `ConfigDict`, not installed here) is a
  stub module whose `ConfigDict` is an attribute namespace; `config.device` is then the CPU, as the
  official code picks without CUDA;
- transformers 5's `LlamaAttention.forward` returns (output, weights) where the official
  `CompressedLlamaDecoderLayer.forward` unpacks 3 values (transformers 4.41 added the cache): a
  forward hook on each attention appends `None` (the present key/value, unused with use_cache off);
- transformers 5's `LlamaModel` takes each decoder layer's output as the hidden states, where the
  official layer returns a 1-tuple: a forward hook on each compressed layer returns its element
  (`model_utils.get_signals` accepts either);
- nothing else: the caught layer-0 keyword arguments already carry transformers 5's
  `position_embeddings`, which the official layer passes on to the attention in its `**kwargs`.
A spy around `rotate.pca_calc` records each eigenvalue vector it returns (read only; the official
function returns none of them).

prunelab runs `pruning=slicegpt` with the same sparsity and orientation, seed 0, the same token ids
at its defaults (`calibration_batch_size` 16, the reference's batches; one extra row sets it to 1,
the batch the pipeline uses for other methods). Compared: every eigenvalue (3 per layer + the embeddings'), every tensor of the sliced
models' state dicts by name (embeddings, q/k/v/o, gate/up/down, both shortcut matrices, the head),
the kept dimensions and parameter counts, and the logits and perplexity on 4 windows of 512 tokens
spread over the held-out realtext split. Float32 on the CPU.

    python experiments/benchmarks/official_slicegpt.py   # ~14 min, 1 thread
    python experiments/benchmarks/official_slicegpt.py --render-only
"""

from __future__ import annotations

import copy
import math
import platform
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pandas as pd
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))  # the `oracles` package
sys.path.insert(0, str(Path(__file__).resolve().parent))

from official_code import SECONDS_NOTE, comparison_parser, render_committed  # noqa: E402
from official_runs import slicegpt_copy, slicegpt_slice  # noqa: E402
from oracles.compare import load_smollm2, realtext_calibration  # noqa: E402

import prunelab  # noqa: E402
from prunelab.data.tokens import eval_token_stream  # noqa: E402
from prunelab.evaluation.perplexity import selected_windows  # noqa: E402
from prunelab.pruning import slicegpt as prunelab_slicegpt  # noqa: E402

REPO = Path("/work/.mirror/microsoft+TransformerCompression/repo")
OFFICIAL_BATCH = 16  # run_slicegpt.py --cal-batch-size
SEED = 0  # prunelab's run seed; np.random.seed(SEED) before the official run
#: row -> (sparsity, final orientation, prunelab's calibration batch size)
SETTINGS = {
    "pca, sparsity 0.25": (0.25, "pca", OFFICIAL_BATCH),
    "pca, sparsity 0.3": (0.3, "pca", OFFICIAL_BATCH),
    "random, sparsity 0.25": (0.25, "random", OFFICIAL_BATCH),
    "pca, sparsity 0.25, calibration_batch_size 1": (0.25, "pca", 1),
}
EVAL_WINDOWS, EVAL_SEQLEN = 4, 512
COLUMNS = {"setting": "setting", "kept_dim": "kept d", "shapes_equal": "shapes equal",
           "eig_max_rel": "eigenvalues max rel", "tensors_identical": "tensors bit-identical",
           "dW_max_abs": "max abs dW", "dW_max_rel": "max rel dW", "dlogits_max_abs": "max abs dlogits",
           "ppl_prunelab": "ppl prunelab", "ppl_official": "ppl official",
           "params_prunelab": "params prunelab", "params_official": "params official",
           "seconds_prunelab": "prunelab s", "seconds_official": "official s"}


@contextmanager
def spy_on_pca(module):
    """`module.pca_calc` (the official rotate's or prunelab's) records each (eigenvalues,
    eigenvectors) it returns while inside (read only)."""
    results: list[tuple[torch.Tensor, torch.Tensor]] = []
    original = module.pca_calc

    def recorded(*args, **kwargs):
        eig_val, eigen_vec = original(*args, **kwargs)
        results.append((eig_val.clone(), eigen_vec.clone()))
        return eig_val, eigen_vec

    module.pca_calc = recorded
    try:
        yield results
    finally:
        module.pca_calc = original


def eigenvector_difference(ours: list[tuple], theirs: list[tuple]) -> tuple[int, int, float]:
    """(eigenvectors compared, those whose sign is flipped, max |difference| once each sign is
    aligned) over every PCA: an eigenvector is defined up to its sign."""
    flipped, largest, total = 0, 0.0, 0
    for (_, a), (_, b) in zip(ours, theirs, strict=True):
        same, opposite = (a - b).abs().amax(dim=0), (a + b).abs().amax(dim=0)  # per column
        flipped += int((opposite < same).sum())
        largest = max(largest, torch.minimum(same, opposite).max().item())
        total += a.shape[1]
    return total, flipped, largest


def run_official(model, token_ids: torch.Tensor, sparsity: float, orientation: str):
    """run_slicegpt.py's slicing steps on `model` (in place, `official_runs.slicegpt_slice`);
    (seconds, the eigenvalues and eigenvectors of each PCA)."""
    from slicegpt import rotate  # noqa: PLC0415  (from the temporary copy)

    with spy_on_pca(rotate) as pcas:
        seconds = slicegpt_slice(model, token_ids, sparsity, orientation, OFFICIAL_BATCH)
    return seconds, pcas


def max_relative(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| / max |b| (relative to the tensor's largest entry: elementwise ratios blow up
    on entries near zero)."""
    scale = b.abs().max().item()
    return (a - b).abs().max().item() / scale if scale else (a - b).abs().max().item()


def compare_states(ours, theirs) -> dict:
    """Every tensor of the two state dicts by name: shapes, bit-identical count, max abs / rel."""
    a, b = ours.state_dict(), theirs.state_dict()
    assert set(a) == set(b), sorted(set(a) ^ set(b))
    shapes = all(a[k].shape == b[k].shape for k in a)
    if not shapes:
        return {"shapes_equal": False, "tensors_identical": 0, "tensors": len(a),
                "dW_max_abs": math.inf, "dW_max_rel": math.inf, "worst_tensor": ""}
    identical = sum(torch.equal(a[k], b[k]) for k in a)
    diffs = {k: ((a[k].double() - b[k].double()).abs().max().item(), max_relative(a[k].double(), b[k].double()))
             for k in a}
    worst = max(diffs, key=lambda k: diffs[k][1])
    return {"shapes_equal": True, "tensors_identical": identical, "tensors": len(a),
            "dW_max_abs": max(d[0] for d in diffs.values()), "dW_max_rel": diffs[worst][1], "worst_tensor": worst}


def kept_dimensions(model) -> tuple:
    """(embedding d, per layer (q in, o out, gate in, down out), head in) read from the shapes."""
    layers = tuple((layer.self_attn.q_proj.in_features, layer.self_attn.o_proj.out_features,
                    layer.mlp.gate_proj.in_features, layer.mlp.down_proj.out_features) for layer in model.model.layers)
    return model.model.embed_tokens.weight.shape[1], layers, model.lm_head.weight.shape[1]


@torch.no_grad()
def window_logits(model, windows: torch.Tensor) -> list[torch.Tensor]:
    return [model(input_ids=w[None]).logits[0] for w in windows]  # each [T, V]


def perplexity(logits: list[torch.Tensor], windows: torch.Tensor) -> float:
    nll = [torch.nn.functional.cross_entropy(l[:-1].double(), w[1:], reduction="sum").item()
           for l, w in zip(logits, windows)]
    return math.exp(sum(nll) / (windows.shape[0] * (windows.shape[1] - 1)))


def eigenvalue_difference(ours: list[list[float]], theirs: list[tuple]) -> tuple[float, float]:
    """(max abs, max rel) over every eigenvalue of every PCA, in order (the damped ones are all > 0);
    `ours` as prunelab's record holds them, `theirs` the official (eigenvalues, eigenvectors)."""
    assert len(ours) == len(theirs), (len(ours), len(theirs))
    a = torch.cat([torch.tensor(v, dtype=torch.float64) for v in ours])
    b = torch.cat([v.double() for v, _ in theirs])
    return (a - b).abs().max().item(), ((a - b).abs() / b.abs()).max().item()


def fmt(value: float) -> str:
    return "0" if value == 0 else f"{value:.2g}"


def render(table: pd.DataFrame, header: str, extra: str) -> str:
    shown = table[list(COLUMNS)].rename(columns=COLUMNS).copy()
    for column in ("eigenvalues max rel", "max abs dW", "max rel dW", "max abs dlogits"):
        shown[column] = shown[column].map(fmt)
    shown["tensors bit-identical"] = [f"{i} / {n}" for i, n in zip(table["tensors_identical"], table["tensors"])]
    for column in ("ppl prunelab", "ppl official"):
        shown[column] = shown[column].map(lambda v: f"{v:.4f}")
    for column in ("params prunelab", "params official"):
        shown[column] = shown[column].map(lambda v: f"{int(v):,}")
    for column in ("prunelab s", "official s"):
        shown[column] = shown[column].map(lambda s: f"{s:.0f}")
    return header + "\n\n" + shown.to_markdown(index=False, disable_numparse=True) + "\n\n" + NOTES + extra


NOTES = """How to read it: `kept d` is the sliced hidden width, int((1 - sparsity) x 576) rounded down
to a multiple of 8, the same everywhere (embeddings, every layer's attention and MLP inputs, o_proj's
rows, down_proj's rows except the last layer's, which writes the unsliced head's 576); `shapes equal`:
every tensor of the two sliced models has the same shape (so the kept dimensions agree layer by layer).
`eigenvalues max rel`: the largest |difference| / eigenvalue over all 61 PCAs (the embeddings', then
the MLP-norm input and the output of each of the 30 layers), 576 eigenvalues each. `max abs dW` /
`max rel dW`: over every tensor of the state dicts (embeddings, q/k/v/o, gate/up/down, both shortcut
matrices of every layer, the head), the largest |difference| and the largest |difference| divided
by that tensor's largest |entry|. `max abs dlogits`, `ppl`: on 4 windows of 512 tokens spread over
the held-out realtext split (token perplexity). `params`: every parameter of the sliced model
(prunelab's record; the official script's `sliced_param_count`), the untied head and the 2 x 30
shortcut matrices included.

Both sides run the same transformers 5 layers on the same batches and sum H in the same order, so
equal means bit for bit: no float tolerance is needed for the first three rows. The `random` row is
the official default orientation: with `np.random.seed(0)` before `rotate_and_slice`, the official
draws are those of prunelab's `RandomState(0)` (the same sizes in the same order: d for the
embeddings, then per layer d after attention and d after the MLP, 576 after the last MLP), so its
weights are equal too. The last row sets prunelab's `calibration_batch_size` to 1 (one sequence per
forward, the batch the pipeline gives other methods, and SliceGPT's before the setting existed)
against the official 16: the same data summed in another order (H a sum of 32
per-sequence X^T X instead of 2 per-16 ones, the layers' matmuls on other shapes), so the float64
H differ in their last bits and `torch.linalg.eigh` may return an eigenvector with the other sign
(or, for two close eigenvalues, another basis of their span); every weight written through it then
changes sign, so weights are not comparable entry by entry there. The function is what that row
compares: eigenvalues within 1e-3 relative, perplexity within 1e-4 relative (measured values below).

""" + SECONDS_NOTE + "\n"


def main() -> int:
    parser = comparison_parser(__doc__.splitlines()[0], "--repo")
    parser.set_defaults(repo=REPO)
    parser.add_argument("--settings", nargs="+", choices=list(SETTINGS), default=list(SETTINGS))
    parser.add_argument("--layers", type=int, default=None, help="keep only the first N layers (a quick check)")
    args = parser.parse_args()
    csv, md = args.out / "official_slicegpt.csv", args.out / "official_slicegpt.md"
    if args.render_only:
        render_committed(csv, md, render, EXTRA_START)
        return 0
    torch.set_num_threads(args.threads)
    loaded = load_smollm2()
    dense, tokenizer = loaded.model.eval(), loaded.tokenizer
    if args.layers:
        dense.model.layers = dense.model.layers[:args.layers]
        dense.config.num_hidden_layers = args.layers
    token_ids = realtext_calibration(tokenizer, args.nsamples, args.seqlen, seed=SEED)
    windows = selected_windows(eval_token_stream("realtext", tokenizer, EVAL_SEQLEN), EVAL_SEQLEN, EVAL_WINDOWS,
                               "spread")  # [4, 512]
    dense_ppl = perplexity(window_logits(dense, windows), windows)
    commit = subprocess.run(["git", "--git-dir", str(args.repo), "rev-parse", "HEAD"], check=True,
                            capture_output=True, text=True).stdout.strip()
    num_layers = len(dense.model.layers)
    header = (f"# prunelab's SliceGPT against the official code ({commit[:7]}, rotate_and_slice): SmolLM2-135M, "
              f"{num_layers} layers, realtext calibration {args.nsamples} x {args.seqlen} tokens (seed {SEED}), "
              f"official batches of {OFFICIAL_BATCH}; float32, CPU ({platform.processor() or platform.machine()}), "
              f"torch {torch.__version__}, {args.threads} thread(s)")
    args.out.mkdir(parents=True, exist_ok=True)
    rows, extra, official_runs = [], f"{EXTRA_START}: dense perplexity {dense_ppl:.4f} on the same windows.\n", {}
    with slicegpt_copy(args.repo):
        for setting in args.settings:
            sparsity, orientation, batch_size = SETTINGS[setting]
            key = (sparsity, orientation)
            if key not in official_runs:
                theirs = copy.deepcopy(dense)
                seconds_theirs, their_pcas = run_official(theirs, token_ids, sparsity, orientation)
                their_logits = window_logits(theirs, windows)
                official_runs[key] = (theirs, seconds_theirs, their_pcas, their_logits)
            theirs, seconds_theirs, their_pcas, their_logits = official_runs[key]
            ours = copy.deepcopy(dense)
            with spy_on_pca(prunelab_slicegpt) as our_pcas:
                start = time.perf_counter()
                report = prunelab.prune(ours, tokenizer, method="slicegpt", calibration=token_ids,
                                        sparsity=sparsity, final_orientation=orientation, seed=SEED,
                                        calibration_batch_size=batch_size, progress=False)
                seconds_ours = time.perf_counter() - start
            our_logits = window_logits(ours, windows)
            _, eig_rel = eigenvalue_difference(report["pruning"]["eigenvalues"], their_pcas)
            vectors, flipped, dQ = eigenvector_difference(our_pcas, their_pcas)
            states = compare_states(ours, theirs)
            dims_ours, dims_theirs = kept_dimensions(ours), kept_dimensions(theirs)
            rows.append({"setting": setting, "sparsity": sparsity, "final_orientation": orientation,
                         "prunelab_batch": batch_size, "kept_dim": report["pruning"]["width"]["sliced_dimension"],
                         **states, "eig_max_rel": eig_rel, "eigenvectors": vectors,
                         "eigenvectors_flipped": flipped, "dQ_max_abs_sign_aligned": dQ,
                         "shapes_equal": "yes" if states["shapes_equal"] and dims_ours == dims_theirs else "NO",
                         "dlogits_max_abs": max((a - b).abs().max().item()
                                                for a, b in zip(our_logits, their_logits)),
                         "ppl_prunelab": perplexity(our_logits, windows),
                         "ppl_official": perplexity(their_logits, windows),
                         "params_prunelab": report["pruning"]["width"]["parameters_after"],
                         "params_official": sum(int(p.nelement()) for p in theirs.parameters()),
                         "params_dense": report["pruning"]["width"]["parameters_before"],
                         "params_removed_prunelab": report["pruning"]["width"]["params_removed"],
                         "official_original_param_count": theirs.original_param_count,
                         "seconds_prunelab": seconds_ours, "seconds_official": seconds_theirs})
            print(rows[-1], flush=True)
            del ours, our_logits
            table = pd.DataFrame(rows)
            table.to_csv(csv, index=False)
            md.write_text(render(table, header, extra))
        extra += difference_note(rows) + orientation_note(official_runs, windows) + parameter_note(rows[0])
        md.write_text(render(table, header, extra))
    print(md.read_text())
    return 0


def difference_note(rows: list[dict]) -> str:
    """For each row whose weights differ: where the eigenvectors differ (sign, then the rest)."""
    lines = []
    for row in rows:
        if row["tensors_identical"] == row["tensors"]:
            continue
        ppl_rel = abs(row["ppl_prunelab"] - row["ppl_official"]) / row["ppl_official"]
        lines.append(f"\nMeasured ({row['setting']}): {row['eigenvectors_flipped']} of the "
                     f"{row['eigenvectors']:,} eigenvectors have the other sign; with each sign aligned the "
                     f"largest eigenvector difference is {row['dQ_max_abs_sign_aligned']:.3g}; the largest "
                     f"weight difference relative to its tensor's largest entry is {row['dW_max_rel']:.3g} "
                     f"({row['worst_tensor']}); eigenvalues within {row['eig_max_rel']:.2g} relative, "
                     f"perplexity within {ppl_rel:.2g} relative, logits within {row['dlogits_max_abs']:.2g}.\n")
    return "".join(lines)


def parameter_note(row: dict) -> str:
    """The dense count, the official script's own "before" count and the two reductions."""
    dense, before, after = row["params_dense"], row["official_original_param_count"], row["params_official"]
    return (f"\nParameters ({row['setting']}): dense {dense:,} (tied head counted once); the official script's "
            f"`original_param_count`, taken after fusion, is {before:,} (the untied head counted, the norm "
            f"weights gone), so it logs a sliced fraction of {1 - after / before:.4f}; the sliced model has "
            f"{after:,} parameters, {after - dense:+,} against dense (prunelab's record: params_removed "
            f"{row['params_removed_prunelab']:.4f}).\n")


def orientation_note(official_runs: dict, windows: torch.Tensor) -> str:
    """How far the official random-orientation weights are from its pca ones at sparsity 0.25 (so
    equal weights under `random` say the seeded draws line up)."""
    pca, random = official_runs.get((0.25, "pca")), official_runs.get((0.25, "random"))
    if not (pca and random):
        return ""
    a, b = pca[0].state_dict(), random[0].state_dict()
    moved = max((a[k] - b[k]).abs().max().item() for k in a)
    return (f"\nThe official random orientation moves the weights: at sparsity 0.25 they differ from its pca "
            f"ones by up to {moved:.3g} (max abs), the function by rounding only (ppl "
            f"{perplexity(random[3], windows):.4f} against {perplexity(pca[3], windows):.4f}).\n")


EXTRA_START = "\nMeasured"

if __name__ == "__main__":
    raise SystemExit(main())
