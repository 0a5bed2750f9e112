"""prunelab against the official code the way users meet both: a model from plain `from_pretrained`,
each side in a process of its own, at a chosen torch thread count.

The other official-code comparisons (`official_*.py`) run both sides in one process on deep copies
of prunelab's loaded model. A researcher meets the methods otherwise: `AutoModelForCausalLM.
from_pretrained(folder)` in a fresh process, whatever thread count the machine gives. This script
runs every case in each of these modes and counts, per linear of the decoder layers, the mask
entries where the two sides differ (for the width methods, which cut heads and channels out of the
modules, the heads and channels kept by one side only, and the largest weight and bias difference):

- `process-1t` / `process-2t`: the official code in one subprocess (its repository's function, its
  command line's defaults, CPU shims only; no prunelab module is imported there, which the child
  checks), prunelab's public API (`prunelab.prune(model, tokenizer, method=..., calibration=ids)`)
  in another, each loading the folder with plain `from_pretrained` (float32, default attention,
  nothing set) and setting `torch.set_num_threads` to 1 or 2;
- `inprocess`: one subprocess loads the folder once and runs both sides on deep copies of it.

The folder is the `save_pretrained` folder prunelab converts SmolLM2-135M's GGUF into (the same
weights every prunelab run uses); the calibration is realtext, 32 x 256 tokens, seed 0, given to
both sides as token ids. The width cases (FLAP's repository: FLAP, Wanda-sp, magnitude-sp) run on
that model's exact multi-head rewrite (the official code knows no key/value groups), which this
script builds once with prunelab (`models.width.to_multi_head`) and saves beside the calibration
ids, loaded by both sides with `from_pretrained(folder, dtype=torch.float16)` as FLAP's main.py
loads its model, with FLAP's calibration size, 16 x 128 tokens (`faithful_width.py`'s). LLM-Pruner's
block-wise cases (hf_prune.py run as a script, `official_runs.run_llm_pruner`) use the same rewrite
in float32 on hf_prune.py's 10 x 64 tokens. The SliceGPT case (run_slicegpt.py's slicing steps with
the official library functions, `official_runs.run_slicegpt`) slices the folder's model itself and
compares every state-dict tensor by name, the parameter counts and each side's perplexity on 4
held-out realtext windows of 512 tokens (`official_slicegpt.py`'s).
Rows go to the CSV as they finish, and a rerun skips the rows it has.

    python experiments/benchmarks/user_conditions.py --repo ria=/work/.mirror/<ria>/repo \\
        --repo dsnot=... --repo dlp=... --repo alps=... --repo flap=... --repo llm_pruner=... \\
        --repo slicegpt=... --repo wanda=... --repo owl=... [--cases ria_unstructured,...] [--layers 8] \\
        [--modes process-1t,process-2t,inprocess] --out results/benchmarks
    python experiments/benchmarks/user_conditions.py --render-only --out results/benchmarks
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


@dataclass(frozen=True)
class Case:
    """One official command line and the prunelab call that claims to reproduce it."""

    name: str
    method: str  # official_runs.RUNNERS key
    official: str  # the official switches
    prunelab: dict[str, Any]  # prunelab.prune keywords
    layers: int | None = None  # the first N decoder layers only (ALPS: an hour a side for all 30)
    weights: bool = False  # also compare the kept weights (methods that refit them)
    width: bool = False  # cuts heads and channels: compare the kept units, weights and biases
    sliced: bool = False  # rotates and slices the hidden width (SliceGPT): compare every tensor and the perplexity
    dtype: str = "float32"  # what both sides load the folder in (float32: plain from_pretrained)
    nsamples: int = 32  # the calibration: realtext, nsamples x seqlen tokens, seed 0
    seqlen: int = 256


#: the width cases: FLAP's main.py loads float16, and faithful_width.py's calibration (seqlen 128, main.py's)
WIDTH = {"width": True, "dtype": "float16", "nsamples": 16, "seqlen": 128}
FLAP_RATIO = "--pruning_ratio 0.2 --remove_heads -1"  # scripts/llama_7b.sh's
#: LLM-Pruner's block-wise cases: hf_prune.py on the CPU keeps float32; its 10 examples of 64 tokens
LLM_PRUNER = {"width": True, "nsamples": 10, "seqlen": 64}
LLM_PRUNER_ALL = ("--block_wise --pruning_ratio 0.25 --block_attention_layer_start 0 --block_attention_layer_end 30 "
                  "--block_mlp_layer_start 0 --block_mlp_layer_end 30")  # the README's flags, every layer
LLM_PRUNER_OURS = {"method": "llm_pruner", "ratio": 0.25, "layer_start": 0, "layer_end": None, "batch_size": 10}
#: held-out windows each side's perplexity is measured on in the sliced cases (official_slicegpt.py's)
EVAL_WINDOWS, EVAL_SEQLEN = 4, 512

CASES = [
    Case("locuslab_wanda_50", "wanda", "--prune_method wanda", {"method": "wanda"}),
    Case("locuslab_sparsegpt_50", "wanda", "--prune_method sparsegpt", {"method": "sparsegpt"}, weights=True),
    Case("wanda_50", "dlp", "--prune_method wanda --sparsity_ratio 0.5", {"method": "wanda"}),
    Case("wanda_2of4", "dlp", "--prune_method wanda --sparsity_type 2:4", {"method": "wanda", "sparsity_type": "2:4"}),
    Case("ria_unstructured", "ria", "--sparsity_type unstructured", {"method": "ria"}),
    Case("ria_2of4", "ria", "--sparsity_type 2:4", {"method": "ria", "sparsity_type": "2:4"}),
    Case("ria_2of4_heuristic", "ria", "--sparsity_type 2:4 --reallocation",
         {"method": "ria", "sparsity_type": "2:4", "permutation": "heuristic"}),
    Case("ria_2of4_lsa_fast", "ria", "--sparsity_type 2:4 --reallocation --lsa --fast",
         {"method": "ria", "sparsity_type": "2:4", "permutation": "lsa", "lsa_fast": True}),
    Case("wanda_dsnot_50", "dsnot", "--initial_method wanda", {"method": "wanda", "refine": "dsnot"}),
    Case("wanda_dsnot_2of4", "dsnot", "--initial_method wanda --sparsity_type 2:4",
         {"method": "wanda", "refine": "dsnot", "sparsity_type": "2:4"}),
    Case("magnitude_dsnot_50", "dsnot", "--initial_method magnitude",
         {"method": "magnitude", "group": "row", "ties": "exact", "refine": "dsnot"}),
    Case("wanda_dlp_70", "dlp", "--prune_method wanda_dlp --sparsity_ratio 0.7",
         {"method": "wanda", "allocation": "dlp", "sparsity": 0.7}),
    Case("wanda_dlp_50", "dlp", "--prune_method wanda_dlp --sparsity_ratio 0.5",
         {"method": "wanda", "allocation": "dlp", "sparsity": 0.5}),
    Case("sparsegpt_dlp_70", "dlp", "--prune_method sparsegpt_dlp --sparsity_ratio 0.7",
         {"method": "sparsegpt", "allocation": "dlp", "sparsity": 0.7}, weights=True),
    Case("magnitude_dlp_70", "dlp", "--prune_method magnitude_dlp --sparsity_ratio 0.7",
         {"method": "magnitude", "allocation": "dlp", "sparsity": 0.7}),
    Case("wanda_owl_70", "owl", "--prune_method wanda_owl --Lamda 0.08 --Hyper_m 5 --sparsity_ratio 0.7 "
         "--sparsity_type unstructured", {"method": "wanda", "allocation": "owl", "sparsity": 0.7}),
    Case("wanda_owl_50", "owl", "--prune_method wanda_owl --Lamda 0.08 --Hyper_m 5 --sparsity_ratio 0.5 "
         "--sparsity_type unstructured", {"method": "wanda", "allocation": "owl", "sparsity": 0.5}),
    Case("alps_50", "alps", "sp=0.5 --nm_n 0 --nm_m 0", {"method": "alps", "sparsity": 0.5}, layers=4, weights=True),
    Case("alps_70", "alps", "sp=0.7 --nm_n 0 --nm_m 0", {"method": "alps", "sparsity": 0.7}, layers=4, weights=True),
    Case("alps_2of4", "alps", "sp=0.5 --nm_n 2 --nm_m 4", {"method": "alps", "sparsity_type": "2:4"},
         layers=4, weights=True),
    Case("flap_al_am", "flap", f"--prune_method flap {FLAP_RATIO} --metrics WIFV --structure AL-AM",
         {"method": "flap", "ratio": 0.2}, **WIDTH),
    Case("flap_ul_um", "flap", f"--prune_method flap {FLAP_RATIO} --metrics WIFV --structure UL-UM",
         {"method": "flap", "ratio": 0.2, "structure": "UL-UM"}, **WIDTH),
    Case("wanda_sp", "flap", f"--prune_method wanda_sp {FLAP_RATIO}", {"method": "wanda_sp", "ratio": 0.2}, **WIDTH),
    Case("magnitude_sp", "flap", f"--prune_method mag_sp {FLAP_RATIO}", {"method": "magnitude_sp", "ratio": 0.2},
         **WIDTH),
    Case("llm_pruner_taylor", "llm_pruner", f"{LLM_PRUNER_ALL} --pruner_type taylor --taylor param_first",
         {**LLM_PRUNER_OURS, "importance": "taylor", "taylor": "param_first"}, **LLM_PRUNER),
    Case("llm_pruner_l2", "llm_pruner", f"{LLM_PRUNER_ALL} --pruner_type l2",
         {**LLM_PRUNER_OURS, "importance": "l2"}, **LLM_PRUNER),
    Case("slicegpt_pca_25", "slicegpt", "--dtype fp32 --sparsity 0.25 --final-orientation pca --cal-batch-size 16",
         {"method": "slicegpt", "sparsity": 0.25, "final_orientation": "pca", "seed": 0,
          "calibration_batch_size": 16}, sliced=True),
]
BY_NAME = {case.name: case for case in CASES}
#: official_runs.RUNNERS key -> the repository and script whose command line `Case.official` is
SCRIPTS = {"wanda": "locuslab/wanda main.py", "ria": "RIA main.py", "dsnot": "DSnoT main.py", "dlp": "DLP run.py",
           "alps": "ALPS llama.py", "flap": "FLAP main.py", "llm_pruner": "LLM-Pruner hf_prune.py",
           "slicegpt": "TransformerCompression run_slicegpt.py", "owl": "OWL main.py"}
MODES = {"inprocess": "one process, deep copies", "process-1t": "own processes, 1 thread",
         "process-2t": "own processes, 2 threads"}


def at_most(case: Case, layers: int | None) -> Case:
    """The case on at most `layers` decoder layers (None: as the case says)."""
    return case if layers is None else replace(case, layers=min(layers, case.layers or layers))


# ---- in the child processes (the official side imports no prunelab)

def load_plain(folder: Path, layers: int | None, dtype: str = "float32"):
    """The model and tokenizer as a user loads them: plain from_pretrained, nothing set (but the
    dtype where the official script sets one: FLAP's float16)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if dtype == "float32":
        model = AutoModelForCausalLM.from_pretrained(folder)
    else:
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, dtype))
    if layers is not None:
        model.model.layers = torch.nn.ModuleList(list(model.model.layers)[:layers])
        model.config.num_hidden_layers = layers
        model.config.layer_types = model.config.layer_types[:layers] if getattr(
            model.config, "layer_types", None) else None
    return model, AutoTokenizer.from_pretrained(folder)


def linear_state(model, weights: bool) -> dict[str, torch.Tensor]:
    """Each decoder-layer linear's zero pattern (bit-packed) and, with `weights`, its weight."""
    import numpy as np

    state = {}
    for name, parameter in model.model.layers.named_parameters():
        if parameter.dim() == 2:
            zero = (parameter.detach() == 0).numpy()
            state[f"{name}.mask"] = torch.from_numpy(np.packbits(zero.reshape(-1)))
            state[f"{name}.shape"] = torch.tensor(zero.shape)
            if weights:
                state[f"{name}.weight"] = parameter.detach().clone()
    return state


def width_state(model, dense) -> dict[str, Any]:
    """A width-pruned model's kept heads and channels per layer (its q_proj and gate_proj rows
    matched to `dense`'s), the dense unit counts, and every decoder-layer linear's weight and bias."""
    from official_code import kept_units

    head_dim = dense.model.layers[0].self_attn.head_dim
    heads, channels = kept_units(model, dense, head_dim)
    tensors = {}
    for name, module in model.model.layers.named_modules():
        if isinstance(module, torch.nn.Linear):
            tensors[f"{name}.weight"] = module.weight.detach().clone()
            if module.bias is not None:
                tensors[f"{name}.bias"] = module.bias.detach().clone()
    return {"heads": heads, "channels": channels, "tensors": tensors,
            "units": (sum(layer.self_attn.q_proj.out_features // head_dim for layer in dense.model.layers),
                      sum(layer.mlp.gate_proj.out_features for layer in dense.model.layers))}


@torch.no_grad()
def sliced_state(model, windows: torch.Tensor) -> dict[str, Any]:
    """A sliced model's every state-dict tensor, its parameter count, its summed token NLL (float64)
    on the held-out `windows` ([W, T]) and its logits on the first window."""
    nll, first = 0.0, None
    for window in windows:
        logits = model(input_ids=window[None]).logits[0]
        nll += torch.nn.functional.cross_entropy(logits[:-1].double(), window[1:], reduction="sum").item()
        first = logits.clone() if first is None else first
    return {"tensors": {k: v.detach().clone() for k, v in model.state_dict().items()},
            "params": sum(int(p.nelement()) for p in model.parameters()),
            "ppl": float(torch.tensor(nll / (windows.shape[0] * (windows.shape[1] - 1))).exp()), "logits": first}


def side_state(case: Case, model, dense, windows: torch.Tensor | None = None) -> dict[str, Any]:
    """What the parent compares: the sliced or width state, or the zero patterns (and weights)."""
    if case.sliced:
        return sliced_state(model, windows)
    return width_state(model, dense) if case.width else linear_state(model, case.weights)


def run_official_side(case: Case, repo: Path, model, tokenizer, token_ids: torch.Tensor) -> float:
    from official_runs import RUNNERS

    return RUNNERS[case.method](repo, model, tokenizer, token_ids, case.official)


def run_prunelab_side(case: Case, model, tokenizer, token_ids: torch.Tensor) -> float:
    import prunelab

    options = dict(case.prunelab)
    start = time.perf_counter()
    prunelab.prune(model, tokenizer, method=options.pop("method"), calibration=token_ids, progress=False, **options)
    return time.perf_counter() - start


def child(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    case, token_ids = BY_NAME[args.case], torch.load(args.ids)
    case = at_most(case, args.layers)
    model, tokenizer = load_plain(args.folder, case.layers, case.dtype)
    windows = torch.load(args.windows) if case.sliced else None
    out: dict[str, Any] = {}
    if args.side == "official":
        dense = copy.deepcopy(model) if case.width else None  # to read the kept units back
        out["official_seconds"] = run_official_side(case, args.repo, model, tokenizer, token_ids)
        loaded = sorted(name for name in sys.modules if name.split(".")[0] == "prunelab")
        if loaded:
            raise SystemExit(f"the official side imported prunelab: {loaded[:3]}")
        out["official"] = side_state(case, model, dense, windows)
    elif args.side == "prunelab":
        dense = copy.deepcopy(model) if case.width else None
        out["prunelab_seconds"] = run_prunelab_side(case, model, tokenizer, token_ids)
        out["prunelab"] = side_state(case, model, dense, windows)
    else:  # both, in this one process, on deep copies
        official = copy.deepcopy(model)
        out["official_seconds"] = run_official_side(case, args.repo, official, tokenizer, token_ids)
        out["official"] = side_state(case, official, model, windows)
        del official
        ours = copy.deepcopy(model)
        out["prunelab_seconds"] = run_prunelab_side(case, ours, tokenizer, token_ids)
        out["prunelab"] = side_state(case, ours, model, windows)
    out["threads"] = torch.get_num_threads()
    torch.save(out, args.out)


# ---- in the parent

def user_folder(model: str, cache_dir: Path | None, folder: Path | None = None) -> Path:
    """The save_pretrained folder that prunelab's `model=<model>` loads (for a GGUF model, the folder
    it converts the file into once) or `folder` itself."""
    if folder is None:
        sys.path.insert(0, str(HERE.parents[1] / "tests"))
        from oracles.compare import SMOLLM2_CACHE  # noqa: PLC0415

        from prunelab.cli import model_preset  # noqa: PLC0415
        from prunelab.models import load_model  # noqa: PLC0415

        folder = Path(load_model(model_preset(model, device="cpu"), cache_dir=cache_dir or SMOLLM2_CACHE).source)
    return folder


def multi_head_folder(folder: Path) -> Path:
    """`folder`'s model rewritten by prunelab as its exact multi-head equivalent
    (`models.width.to_multi_head`: each key/value head repeated for its query heads), saved with
    its tokenizer by `save_pretrained` (in the folder's dtype) once, beside the calibration ids."""
    target = Path(tempfile.gettempdir()) / f"prunelab_user_conditions_{folder.name}_multi_head"
    if (target / "config.json").exists():
        return target
    from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: PLC0415

    from prunelab.models.adapter import ModelAdapter  # noqa: PLC0415
    from prunelab.models.width import to_multi_head  # noqa: PLC0415

    model = AutoModelForCausalLM.from_pretrained(folder)
    to_multi_head(ModelAdapter(model))
    partial = Path(tempfile.mkdtemp(prefix=f"{target.name}-", dir=target.parent))
    model.save_pretrained(partial)
    AutoTokenizer.from_pretrained(folder).save_pretrained(partial)
    partial.rename(target)  # whole or not at all
    return target


def calibration_ids(folder: Path, nsamples: int, seqlen: int) -> Path:
    """A file with the calibration ids: realtext, nsamples x seqlen, seed 0, drawn with `folder`'s
    tokenizer."""
    sys.path.insert(0, str(HERE.parents[1] / "tests"))
    from oracles.compare import realtext_calibration  # noqa: PLC0415
    from transformers import AutoTokenizer  # noqa: PLC0415

    name = folder.name.removeprefix("prunelab_user_conditions_")
    ids = Path(tempfile.gettempdir()) / f"prunelab_user_conditions_{name}_ids_{nsamples}x{seqlen}.pt"
    torch.save(realtext_calibration(AutoTokenizer.from_pretrained(folder), nsamples, seqlen, seed=0), ids)
    return ids


def eval_windows(folder: Path) -> Path:
    """A file with the held-out windows the sliced cases' perplexity is measured on: prunelab's
    realtext evaluation split, EVAL_WINDOWS windows of EVAL_SEQLEN tokens spread over it (as
    official_slicegpt.py measures it), drawn with `folder`'s tokenizer."""
    from transformers import AutoTokenizer  # noqa: PLC0415

    from prunelab.data.tokens import eval_token_stream  # noqa: PLC0415
    from prunelab.evaluation.perplexity import selected_windows  # noqa: PLC0415

    name = folder.name.removeprefix("prunelab_user_conditions_")
    path = Path(tempfile.gettempdir()) / f"prunelab_user_conditions_{name}_windows_{EVAL_WINDOWS}x{EVAL_SEQLEN}.pt"
    stream = eval_token_stream("realtext", AutoTokenizer.from_pretrained(folder), EVAL_SEQLEN)
    torch.save(selected_windows(stream, EVAL_SEQLEN, EVAL_WINDOWS, "spread"), path)
    return path


def spawn(side: str, case: Case, mode: str, folder: Path, ids: Path, repo: Path, workdir: Path,
          windows: Path | None = None) -> dict:
    threads = 2 if mode == "process-2t" else 1
    out = workdir / f"{case.name}-{mode}-{side}.pt"
    command = [sys.executable, __file__, "--child", side, "--case", case.name, "--threads", str(threads),
               *(["--layers", str(case.layers)] if case.layers else []),
               "--folder", str(folder), "--ids", str(ids), "--repo", str(repo), "--child-out", str(out),
               *(["--windows", str(windows)] if windows else [])]
    env = {**os.environ, "PYTHONHASHSEED": "random"}
    subprocess.run(command, check=True, env=env, stdout=subprocess.DEVNULL)
    result = torch.load(out)
    out.unlink()
    return result


def compare(ours: dict[str, torch.Tensor], theirs: dict[str, torch.Tensor]) -> dict[str, Any]:
    """Differing zero-pattern entries per linear, and the largest weight difference where kept."""
    import numpy as np

    per_linear, entries, max_dw = {}, 0, None
    for key in sorted(k for k in ours if k.endswith(".mask")):
        name = key.removesuffix(".mask")
        shape = tuple(ours[f"{name}.shape"].tolist())
        count = int(np.prod(shape))
        a = np.unpackbits(ours[key].numpy())[:count]
        b = np.unpackbits(theirs[key].numpy())[:count]
        per_linear[name] = int((a != b).sum())
        entries += count
        if f"{name}.weight" in ours:
            diff = float((ours[f"{name}.weight"] - theirs[f"{name}.weight"]).abs().max())
            max_dw = diff if max_dw is None else max(max_dw, diff)
    differing = {name: n for name, n in per_linear.items() if n}
    return {"linears": len(per_linear), "linears_differing": len(differing),
            "differing_entries": sum(differing.values()), "entries": entries, "max_abs_dW": max_dw,
            "first_differing": ", ".join(list(differing)[:3])}


def compare_width(ours: dict[str, Any], theirs: dict[str, Any]) -> dict[str, Any]:
    """Heads and channels kept by one side only, the largest difference of any weight and of any
    bias (a missing bias is zeros; inf where the shapes differ), and the first layers that differ."""
    from official_code import differing

    heads, channels = ours["units"]
    max_dw = max_db = 0.0
    mine, other = ours["tensors"], theirs["tensors"]
    for name in sorted(set(mine) | set(other)):
        a, b = mine.get(name), other.get(name)
        a = torch.zeros_like(b) if a is None else a  # only a bias is ever missing
        b = torch.zeros_like(a) if b is None else b
        diff = float("inf") if a.shape != b.shape else float((a.float() - b.float()).abs().max())
        if name.endswith(".bias"):
            max_db = max(max_db, diff)
        else:
            max_dw = max(max_dw, diff)
    first = []
    for layer, units in enumerate(zip(ours["heads"], theirs["heads"], ours["channels"], theirs["channels"])):
        h = sorted(set(units[0]) ^ set(units[1]))
        c = sorted(set(units[2]) ^ set(units[3]))
        if h or c:
            first.append(f"layer {layer}: heads {h} channels {c[:4]}{'...' if len(c) > 4 else ''}")
    return {"heads": heads, "heads_differing": differing(ours["heads"], theirs["heads"]), "channels": channels,
            "channels_differing": differing(ours["channels"], theirs["channels"]),
            "heads_kept": sum(map(len, ours["heads"])), "channels_kept": sum(map(len, ours["channels"])),
            "max_abs_dW": max_dw, "max_abs_dbias": max_db, "first_differing": "; ".join(first[:3])}


def compare_sliced(ours: dict[str, Any], theirs: dict[str, Any]) -> dict[str, Any]:
    """State-dict tensors that differ (by name; inf where names or shapes differ), the largest
    weight difference, both parameter counts and perplexities, the largest logit difference."""
    a, b = ours["tensors"], theirs["tensors"]
    names = sorted(set(a) | set(b))
    diffs = {k: (float("inf") if k not in a or k not in b or a[k].shape != b[k].shape
                 else float((a[k].double() - b[k].double()).abs().max())) for k in names}
    differing = [k for k in names if diffs[k] != 0]
    return {"tensors": len(names), "tensors_differing": len(differing), "max_abs_dW": max(diffs.values()),
            "params_prunelab": ours["params"], "params_official": theirs["params"],
            "ppl_prunelab": ours["ppl"], "ppl_official": theirs["ppl"],
            "max_abs_dlogits": float((ours["logits"] - theirs["logits"]).abs().max()),
            "first_differing": ", ".join(differing[:3])}


def folder_label(folder: Path) -> str:
    """The model's name as its config gives it (a converted GGUF folder is named by a hash);
    `multi-head` where every query head has its own key/value head (the width cases' rewrite)."""
    config = json.loads((folder / "config.json").read_text())
    label = f"{config.get('model_type')} {config.get('num_hidden_layers')}L h{config.get('hidden_size')}"
    return label + (" multi-head" if config.get("num_key_value_heads") == config.get("num_attention_heads") else "")


def measure(case: Case, mode: str, folder: Path, ids: Path, repo: Path, windows: Path | None = None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as workdir:
        if mode == "inprocess":
            both = spawn("both", case, mode, folder, ids, repo, Path(workdir), windows)
            official, ours = both, both
        else:
            official = spawn("official", case, mode, folder, ids, repo, Path(workdir), windows)
            ours = spawn("prunelab", case, mode, folder, ids, repo, Path(workdir), windows)
    comparison = compare_sliced if case.sliced else compare_width if case.width else compare
    differences = comparison(ours["prunelab"], official["official"])
    row = {"model": folder_label(folder), "case": case.name, "method": case.method, "official": case.official,
           "prunelab": json.dumps(case.prunelab), "layers": case.layers or "all", "mode": mode,
           **differences, "threads": ours["threads"],
           "seconds_official": official["official_seconds"], "seconds_prunelab": ours["prunelab_seconds"]}
    if case.width:
        row.update(dtype=case.dtype, nsamples=case.nsamples, seqlen=case.seqlen)
    return row


NOTES = """How to read it: each cell is `linears whose mask differs / linears compared (differing entries)`
over the decoder-layer linears of the first `layers` layers (`model` is the folder's model type,
layer count and hidden size: `llama 30L h576` is SmolLM2-135M, `qwen2 24L h896` Qwen2.5-Coder-0.5B,
both the dequantized 4-bit GGUFs prunelab converts). `max |dW|` (ALPS and SparseGPT, which refit the
kept weights, and the width and sliced rows) is the largest difference between the two sides'
pruned weights in any mode. Modes: `one process` runs both sides in one subprocess on deep copies of
one `from_pretrained` model; `own processes` runs the official code and prunelab each in a fresh
process of its own (Python's hash seed random in each), each loading the folder with plain
`from_pretrained` (float32, default attention, nothing set), at 1 or 2 torch threads. The official
side is the repository's own function (`official_runs.py`), unedited, CPU shims only, and imports no
prunelab module (the child process checks). The prunelab side is the public API,
`prunelab.prune(model, tokenizer, method=..., calibration=token_ids, ...)` with the keywords shown.
`not run`: a mode not measured (the Qwen2.5 rows ran in own processes at one thread only: its
SparseGPT takes about 23 minutes a side). The SmolLM2 sparse rows cover the first 8 layers (ALPS its
first 4: about an hour a side for all 30); the in-process tables of `official_ria.md`,
`official_dsnot.md`, `official_dlp.md` and `official_alps_all_layers.md` cover all 30. DSnoT's main.py takes `--initial_method wanda`,
`sparsegpt` or `magnitude` only (its argparse choices), so DSnoT over RIA has no official command to
compare with; its other real base, magnitude (`magnitude_dsnot_50`: prunelab's `group=row
ties=exact`, the official per-row |W| mask), is compared instead (its SparseGPT path never
accumulates the Hessian, README).

The OWL rows are OWL's main.py with its README's Wanda+OWL flags (`--Lamda 0.08 --Hyper_m 5
--sparsity_type unstructured`, at `--sparsity_ratio` 0.7 and 0.5; `prune_wanda_outlier`, CPU shims
only) against `allocation=owl` (conf/pruning/allocation/owl.yaml: `lam` 0.08, `outlier_m` 5, the
plain mean over layers). OWL, like DLP, allocates across the layers before pruning: on the first 8
layers both sides load the 8-layer model and compute the outlier ratios and the band over those 8
(as the DLP rows do), so the comparison covers the allocation as well as the masks. The official
argparse default is `--Hyper_m 3` (the README runs pass 5); prunelab reproduces it with
`overrides=["pruning.allocation.outlier_m=3"]`. Two official behaviours prunelab does not copy, off
these settings: a layer whose sparsity would be <= 0 is pruned at 0.01 there (prunelab refuses a
negative one with a ConfigError and leaves one of exactly 0 dense), and equal outlier ratios in every layer divide by zero there (NaN
sparsities; prunelab gives every layer the target).

The width rows (`multi-head`: SmolLM2-135M's exact multi-head rewrite, 9 heads of 64 and 1,536 MLP
channels in each of 30 layers, which FLAP's and LLM-Pruner's code need, saved once by prunelab's
`to_multi_head`) are FLAP's repository's `prune_flap`, `prune_wanda_sp` and `prune_magnitude_sp` at
ratio 0.2 (shimmed as `faithful_width.py` describes), both sides loading the folder in float16 as
FLAP's main.py does, on 16 x 128 realtext tokens (main.py's seqlen), and LLM-Pruner's hf_prune.py
(run as a script, its README's block-wise flags over every layer, ratio 0.25, on a model of its own
modeling file holding the folder's float32 weights, as `official_llm_pruner.py` describes) on 10 x
64 realtext tokens (its `--num_examples 10`, seq_len 64). Their cells read `differing heads / heads,
differing channels / channels`: units kept by one side only, summed over the layers; `max |dW|` and
`max |dbias|` are the largest differences of any decoder-layer weight and of the o_proj and
down_proj biases (FLAP's compensation; the official side's zero biases for Wanda-sp and
magnitude-sp, a missing bias counted as zeros) after pruning, in any mode: 0 is bit-identical.

The SliceGPT row is run_slicegpt.py's slicing steps (`--dtype fp32`, the official library's
`replace_layers`, `fuse_modules`, `rotate_and_slice`, transformers 5 hooks outside its files, as
`official_slicegpt.py` describes) on all 30 layers of the folder's model, 32 x 256 tokens in
batches of 16. Its cells read `tensors that differ / tensors of the sliced model's state dict`
(compared by name: embeddings, q/k/v/o, gate/up/down, both shortcut matrices of each layer, the
head) and the difference of the two sides' perplexities on 4 windows of 512 held-out realtext
tokens; the parameter counts and the logits on the first window are compared too (the CSV).
"""


def render(table, header: str) -> str:
    import pandas as pd

    def cell(row) -> str:
        if pd.notna(getattr(row, "tensors", float("nan"))):  # a sliced row: every tensor, the perplexity
            dppl = abs(row.ppl_prunelab - row.ppl_official)
            return (f"{int(row.tensors_differing)} / {int(row.tensors)} tensors, "
                    f"ppl difference {'0' if dppl == 0 else f'{dppl:.2g}'}")
        if pd.notna(getattr(row, "heads", float("nan"))):  # a width row: the units kept by one side only
            return (f"{int(row.heads_differing)} / {int(row.heads)} heads, "
                    f"{int(row.channels_differing):,} / {int(row.channels):,} channels")
        return f"{int(row.linears_differing)} / {int(row.linears)} ({int(row.differing_entries):,})"

    def largest(column: str) -> list[str]:
        if column not in table:
            return [""] * len(wide)
        most = table.groupby(["model", "case"], sort=False)[column].max()
        return [("" if pd.isna(most.get((m, c))) else f"{most[m, c]:.3g}") for m, c in zip(wide["model"], wide["case"])]

    def setting(keywords: str) -> str:
        return " ".join(f"{k}={v}" for k, v in json.loads(keywords).items())

    cells = table.assign(cell=[cell(r) for r in table.itertuples()], prunelab=table["prunelab"].map(setting),
                         official=[f"{SCRIPTS[m]} {o}" for m, o in zip(table["method"], table["official"])],
                         layers=table["layers"].astype(str))
    index = ["model", "case", "official", "prunelab", "layers"]
    wide = cells.pivot_table(index=index, columns="mode", values="cell", aggfunc="first", sort=False).reset_index()
    wide.columns.name = None
    wide = wide.rename(columns=MODES).fillna("not run")
    wide["max |dW|"] = largest("max_abs_dW")
    wide["max |dbias|"] = largest("max_abs_dbias")
    order = [*index, *[MODES[m] for m in MODES if MODES[m] in wide], "max |dW|",
             *(["max |dbias|"] if "max_abs_dbias" in table else [])]
    return f"# {header}\n\n{wide[order].to_markdown(index=False, disable_numparse=True)}\n\n{NOTES}"


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", action="append", default=[], metavar="METHOD=GITDIR",
                        help="git dir of a fetched official repository: wanda=, ria=, dsnot=, dlp=, alps=, flap=, "
                             "llm_pruner=, slicegpt=, owl=")
    parser.add_argument("--cases", default=",".join(BY_NAME), help="comma-separated case names")
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)}")
    parser.add_argument("--out", type=Path, default=Path("results/benchmarks"))
    parser.add_argument("--model", default="smollm2_135m", help="a prunelab model= option whose folder both sides load")
    parser.add_argument("--model-folder", type=Path, default=None, help="a save_pretrained folder instead of --model")
    parser.add_argument("--cache-dir", type=Path, default=None, help="prunelab's cache (the converted GGUF)")
    parser.add_argument("--layers", type=int, default=None,
                        help="at most the first N decoder layers in every case (ALPS keeps its 4)")
    parser.add_argument("--render-only", action="store_true")
    parser.add_argument("--child", choices=["official", "prunelab", "both"], help=argparse.SUPPRESS)
    parser.add_argument("--case", help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--folder", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--ids", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--child-out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--windows", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.side = args.child
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.child:
        args.repo = Path(args.repo[0]) if args.repo else None
        args.out = args.child_out
        return child(args)
    import pandas as pd

    csv = args.out / "official_user_conditions.csv"
    header = ("prunelab against the official code as users run both: models from `from_pretrained`, "
              "realtext calibration 32 x 256 tokens (seed 0), fp32 (FLAP's rows: 16 x 128 tokens, float16; "
              "LLM-Pruner's: 10 x 64), "
              f"CPU ({torch.backends.cpu.get_cpu_capability()}), torch {torch.__version__}")
    if not args.render_only:
        repos = dict(item.split("=", 1) for item in args.repo)
        unknown = [c for c in args.cases.split(",") if c not in BY_NAME]
        if unknown:
            raise SystemExit(f"unknown case(s) {unknown}; known: {', '.join(BY_NAME)}")
        args.out.mkdir(parents=True, exist_ok=True)
        base = user_folder(args.model, args.cache_dir, args.model_folder)
        done = pd.read_csv(csv) if csv.exists() else pd.DataFrame(columns=["model", "case", "mode"])
        for name in args.cases.split(","):
            case = at_most(BY_NAME[name], args.layers)
            if case.method not in repos:
                print(f"{name}: skipped (no --repo {case.method}=...)", flush=True)
                continue
            folder = multi_head_folder(base) if case.width else base
            ids, model = calibration_ids(folder, case.nsamples, case.seqlen), folder_label(folder)
            windows = eval_windows(folder) if case.sliced else None
            for mode in args.modes.split(","):
                if ((done["model"] == model) & (done["case"] == name) & (done["mode"] == mode)).any():
                    continue
                try:
                    row = measure(case, mode, folder, ids, Path(repos[case.method]), windows)
                except subprocess.CalledProcessError as err:  # the others still run; a rerun retries it
                    print(f"{name} [{mode}]: a side failed (exit {err.returncode}); not recorded", flush=True)
                    continue
                found = (f"{row['tensors_differing']} of {row['tensors']} tensors differ (max |dW| {row['max_abs_dW']:.3g}, "
                         f"ppl {row['ppl_prunelab']:.4f} vs {row['ppl_official']:.4f}" if case.sliced else
                         f"{row['heads_differing']} heads, {row['channels_differing']} channels differ (max |dW| "
                         f"{row['max_abs_dW']:.3g}, max |dbias| {row['max_abs_dbias']:.3g}" if case.width else
                         f"{row['linears_differing']} of {row['linears']} linears differ ({row['differing_entries']} entries")
                print(f"{name} [{mode}]: {found}; {row['seconds_official']:.0f} s official, "
                      f"{row['seconds_prunelab']:.0f} s prunelab)", flush=True)
                done = pd.concat([done, pd.DataFrame([row])], ignore_index=True)
                done.to_csv(csv, index=False)
    (args.out / "official_user_conditions.md").write_text(render(pd.read_csv(csv), header))
    print((args.out / "official_user_conditions.md").read_text())


if __name__ == "__main__":
    main()
