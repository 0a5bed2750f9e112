"""The official pruning code's entry points, as each repository's command line calls them.

Nothing here imports prunelab: `user_conditions.py` runs these functions in a process of their
own, on a model loaded by plain `from_pretrained`, the way a user of the official repository runs
it, and checks afterwards that no prunelab module was loaded. The in-process comparisons
(`official_ria.py`, `official_dsnot.py`, `official_dlp.py`, `official_alps.py`, `faithful_width.py`,
`official_llm_pruner.py`, `official_slicegpt.py`) call the same functions on a deep copy of
prunelab's model.

Each function prunes `model` in place with the calibration token ids `token_ids` ([N, T]) and
returns its wall seconds; `repo` is the git dir of the fetched official repository, whose files are
copied unedited into a temporary folder (`official_code.official_copy`).
"""

from __future__ import annotations

import logging
import os
import runpy
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from official_code import cpu_shims, importable, official_copy  # noqa: E402


def switch(switches: str, name: str, default: str) -> str:
    """The value given to `name` on the command line `switches`, else the script's default."""
    words = switches.split()
    return words[words.index(name) + 1] if name in words else default


def nm_of(sparsity_type: str) -> tuple[int, int]:
    """(prune_n, prune_m) as main.py passes them: (0, 0) for unstructured."""
    return (0, 0) if sparsity_type == "unstructured" else tuple(map(int, sparsity_type.split(":")))


# ---- Wanda (locuslab/wanda, lib/prune.py prune_wanda / prune_sparsegpt / prune_magnitude)

WANDA_FILES = ("lib/prune.py", "lib/layerwrapper.py", "lib/sparsegpt.py", "lib/ablate.py")


def run_wanda(repo: Path, model, tokenizer, token_ids: torch.Tensor, switches: str) -> float:
    """`main.py --prune_method <wanda|sparsegpt|magnitude> <switches>` on `model` (its loops know
    only `model.model.layers`, so any Llama-like model: Llama, Qwen2, Mistral)."""
    args = types.SimpleNamespace(
        model="smollm2-llama", seed=0, nsamples=token_ids.shape[0],
        sparsity_ratio=float(switch(switches, "--sparsity_ratio", "0.5")),
        sparsity_type=switch(switches, "--sparsity_type", "unstructured"),
        prune_method=switch(switches, "--prune_method", "wanda"), use_variant="--use_variant" in switches.split())
    pruners = {"wanda": "prune_wanda", "sparsegpt": "prune_sparsegpt", "magnitude": "prune_magnitude"}
    return run_lib_pruner(repo, WANDA_FILES, "lib.prune", pruners[args.prune_method], args, model, tokenizer,
                          token_ids)


def run_lib_pruner(repo: Path, files: tuple[str, ...], module: str, function: str, args: types.SimpleNamespace,
                   model, tokenizer, token_ids: torch.Tensor) -> float:
    """The repository's `module.function(args, model, tokenizer, device, prune_n, prune_m)` (the
    signature Wanda's lib/prune.py set and OWL's lib/prune_all.py keeps), run on the CPU from a copy
    of `files`; returns its wall time."""
    import importlib

    n, m = nm_of(args.sparsity_type)
    with tempfile.TemporaryDirectory() as folder:
        official_copy(repo, files, Path(folder))
        with importable(Path(folder)), cpu_shims(model, token_ids):
            pruner = getattr(importlib.import_module(module), function)
            start = time.perf_counter()
            pruner(args, model, tokenizer, torch.device("cpu"), prune_n=n, prune_m=m)
            return time.perf_counter() - start


# ---- RIA (biomedical-cybernetics/Relative-importance-and-activation-pruning, lib/prune.py prune_ria)

RIA_FILES = ("lib/prune.py", "lib/layerwrapper.py", "lib/sparsegpt.py", "lib/quant.py")


def ria_args(switches: str, nsamples: int, seqlen: int) -> types.SimpleNamespace:
    """main.py's arguments for these switches (its defaults otherwise)."""
    words = switches.split()
    return types.SimpleNamespace(
        model="smollm2-llama",  # its loops branch on "llama" in the model name
        seed=0, calib_dataset="realtext", nsamples=nsamples, seqlen=seqlen,
        sparsity_ratio=float(switch(switches, "--sparsity_ratio", "0.5")),
        sparsity_type=switch(switches, "--sparsity_type", "unstructured"), prune_method="ria", a=0.5,
        reconstruction=False, gptq=False, reallocation="--reallocation" in words, lsa="--lsa" in words,
        fast="--fast" in words, importance_score="sum", per_outneuron=False, semi_sparse_acc=False)


def run_ria(repo: Path, model, tokenizer, token_ids: torch.Tensor, switches: str) -> float:
    """`main.py --prune_method ria <switches>`: the official prune_ria on `model`."""
    args = ria_args(switches, token_ids.shape[0], token_ids.shape[1])
    n, m = nm_of(args.sparsity_type)
    with tempfile.TemporaryDirectory() as folder:
        official_copy(repo, RIA_FILES, Path(folder))
        with importable(Path(folder)), cpu_shims(model, token_ids, cuda_to_cpu=True):
            from lib.prune import prune_ria  # noqa: PLC0415  (imported inside the shims: its lib.data)

            start = time.perf_counter()
            prune_ria(args, model, tokenizer, torch.device("cpu"), prune_n=n, prune_m=m)
            return time.perf_counter() - start


# ---- DSnoT (zyxxmu/DSnoT, lib/prune.py prune_DSnoT)

DSNOT_FILES = ("lib/prune.py", "lib/layerwrapper.py", "lib/sparsegpt.py", "lib/save_results.py")


def dsnot_args(switches: str, nsamples: int) -> types.SimpleNamespace:
    """main.py's arguments for the README command with these switches (its defaults otherwise)."""
    return types.SimpleNamespace(
        model="smollm2-llama", seed=0, nsamples=nsamples,
        sparsity_ratio=float(switch(switches, "--sparsity_ratio", "0.5")),
        sparsity_type=switch(switches, "--sparsity_type", "unstructured"),
        prune_method="DSnoT", initial_method=switch(switches, "--initial_method", "wanda"),
        max_cycle_time=50, without_DSnoT=False, update_threshold=0.1, pow_of_var_regrowing=1.0,
        pow_of_var_pruning=1.0, skip_layer="mlp", skip_sub_layer="no_skip", without_same_sign=True,
        get_time_overhead=False, output_results_file="results.txt")


def run_dsnot(repo: Path, model, tokenizer, token_ids: torch.Tensor, switches: str) -> float:
    """`main.py --prune_method DSnoT <switches>`: the official prune_DSnoT on `model`."""
    args = dsnot_args(switches, token_ids.shape[0])
    n, m = nm_of(args.sparsity_type)
    with tempfile.TemporaryDirectory() as folder:
        official_copy(repo, DSNOT_FILES, Path(folder))
        with importable(Path(folder)), cpu_shims(model, token_ids):
            from lib.prune import prune_DSnoT  # noqa: PLC0415

            start = time.perf_counter()
            prune_DSnoT(args, model, tokenizer, torch.device("cpu"), prune_n=n, prune_m=m)
            return time.perf_counter() - start


# ---- DLP (ironartisan/DLP, run.py: get_dlp_ratios then prune_<base>_dlp; also its copies of
# Wanda's prune_wanda and prune_sparsegpt)

DLP_FILES = ("lib/prune.py", "lib/layerwrapper.py", "lib/utils.py", "lib/sparsegpt.py", "lib/quant.py")
DLP_ALPHA = 0.15  # the README's and every LLaMA script's


def dlp_args(switches: str, nsamples: int) -> types.SimpleNamespace:
    """run.py's arguments for these switches (its defaults and the README's alpha otherwise)."""
    return types.SimpleNamespace(
        model="smollm2-llama", nsamples=nsamples, seed=0,
        sparsity_ratio=float(switch(switches, "--sparsity_ratio", "0.5")),
        sparsity_type=switch(switches, "--sparsity_type", "unstructured"),
        prune_method=switch(switches, "--prune_method", "wanda_dlp"),
        alpha=float(switch(switches, "--alpha", str(DLP_ALPHA))), use_variant=False, strategy="median",
        wbits=16, gptq=False)


def dlp_ratios(repo: Path, model, tokenizer, token_ids: torch.Tensor, switches: str) -> list[float]:
    """The official get_dlp_ratios (what run.py computes before pruning)."""
    args = dlp_args(switches, token_ids.shape[0])
    n, m = nm_of(args.sparsity_type)
    with tempfile.TemporaryDirectory() as folder:
        official_copy(repo, DLP_FILES, Path(folder))
        with importable(Path(folder)), cpu_shims(model, token_ids):
            from lib.prune import get_dlp_ratios  # noqa: PLC0415

            return get_dlp_ratios(args, model, tokenizer, torch.device("cpu"), prune_n=n, prune_m=m)


def run_dlp(repo: Path, model, tokenizer, token_ids: torch.Tensor, switches: str) -> float:
    """`run.py --prune_method <wanda|sparsegpt|magnitude>_dlp <switches>` (the ratios computed, not
    read from its ratios/ cache), or `--prune_method wanda|sparsegpt` (its copies of Wanda's
    functions), on `model`."""
    args = dlp_args(switches, token_ids.shape[0])
    n, m = nm_of(args.sparsity_type)
    cpu = torch.device("cpu")
    with tempfile.TemporaryDirectory() as folder:
        official_copy(repo, DLP_FILES, Path(folder))
        with importable(Path(folder)), cpu_shims(model, token_ids):
            from lib import prune  # noqa: PLC0415

            start = time.perf_counter()
            method = args.prune_method
            if method.endswith("_dlp"):
                ratios = prune.get_dlp_ratios(args, model, tokenizer, cpu, prune_n=n, prune_m=m)
                pruner = {"wanda_dlp": prune.prune_wanda_dlp, "sparsegpt_dlp": prune.prune_sparsegpt_dlp,
                          "magnitude_dlp": prune.prune_mag_dlp}[method]
                pruner(args, model, tokenizer, cpu, ratios, prune_n=n, prune_m=m)
            elif method == "wanda":
                prune.prune_wanda(args, model, tokenizer, cpu, prune_n=n, prune_m=m)
            elif method == "sparsegpt":
                prune.prune_sparsegpt(args, model, tokenizer, cpu, prune_n=n, prune_m=m)
            else:
                raise ValueError(f"no official entry for --prune_method {method}")
            return time.perf_counter() - start


# ---- OWL (luuyin/OWL, main.py --prune_method wanda_owl: lib/prune_all.py prune_wanda_outlier)

OWL_FILES = ("lib/prune_all.py", "lib/layerwrapper.py", "lib/sparsegpt.py")


def owl_args(switches: str, nsamples: int) -> types.SimpleNamespace:
    """main.py's arguments for these switches (its argparse defaults otherwise: --Lamda 0.08,
    --Hyper_m 3; the README's command passes --Hyper_m 5)."""
    return types.SimpleNamespace(
        model="smollm2-llama", seed=0, nsamples=nsamples,
        sparsity_ratio=float(switch(switches, "--sparsity_ratio", "0")),
        sparsity_type=switch(switches, "--sparsity_type", "unstructured"),
        prune_method=switch(switches, "--prune_method", "wanda_owl"), use_variant="--use_variant" in switches.split(),
        Lamda=float(switch(switches, "--Lamda", "0.08")), Hyper_m=float(switch(switches, "--Hyper_m", "3")))


def run_owl(repo: Path, model, tokenizer, token_ids: torch.Tensor, switches: str) -> float:
    """`main.py --prune_method <wanda_owl|sparsegpt_owl|magnitude_owl> <switches>`: the official
    outlier ratios of every layer of `model` (a dense pass), then its layer-wise pruning."""
    args = owl_args(switches, token_ids.shape[0])
    pruners = {"wanda_owl": "prune_wanda_outlier", "sparsegpt_owl": "prune_sparsegpt_outlier",
               "magnitude_owl": "prune_mag_outlier"}
    return run_lib_pruner(repo, OWL_FILES, "lib.prune_all", pruners[args.prune_method], args, model, tokenizer,
                          token_ids)


# ---- ALPS (mazumder-lab/ALPS, llama.py llama_sequential)

ALPS_FILES = ("llama.py", "alps.py", "modelutils.py")
ALPS_MODULES = ("llama", "alps", "modelutils")


def run_alps(repo: Path, model, tokenizer, token_ids: torch.Tensor, switches: str) -> float:
    """`llama.py <model> c4 ALPS <sp> [--nm_n N --nm_m M]`: the official llama_sequential on `model`
    (rho 0.1, as that function hard-codes it). `switches`: "sp=0.5 --nm_n 0 --nm_m 0"."""
    del tokenizer
    sparsity = float(switches.split()[0].removeprefix("sp="))
    args = types.SimpleNamespace(nsamples=token_ids.shape[0], method="ALPS", sp=sparsity,
                                 nm_n=int(switch(switches, "--nm_n", "0")), nm_m=int(switch(switches, "--nm_m", "0")))
    dataloader = [(token_ids[i:i + 1], None) for i in range(token_ids.shape[0])]
    with tempfile.TemporaryDirectory() as folder:
        official_copy(repo, ALPS_FILES, Path(folder))
        with importable(Path(folder)), cpu_shims(model, token_ids, cuda_to_cpu=True):
            try:
                import llama  # noqa: PLC0415  (the official script, imported inside the shims)

                llama.args = args  # llama_sequential reads its command line from the module global
                start = time.perf_counter()
                llama.llama_sequential(model, dataloader, torch.device("cpu"), nsamples=args.nsamples)
                return time.perf_counter() - start
            finally:
                for name in ALPS_MODULES:
                    sys.modules.pop(name, None)


# ---- FLAP (CASIA-IVA-Lab/FLAP, lib/prune.py prune_flap / prune_wanda_sp / prune_magnitude_sp)

FLAP_FILES = ("lib/prune.py", "lib/layerwrapper.py")


@contextmanager
def flap_shims(model, head_dim: int, prune_file: str) -> Iterator[None]:
    """What FLAP's code needs beyond `cpu_shims`: each attention's `num_heads` (its own modeling
    file had one), and the head size 128 it hard-codes (`reshape(-1, 128)`,
    `repeat_interleave(128)`) read as the model's: `Tensor.reshape` and `Tensor.repeat_interleave`
    called from `prune_file` itself (and from nowhere else) see `head_dim` for 128."""
    for layer in model.model.layers:
        layer.self_attn.num_heads = layer.self_attn.q_proj.out_features // head_dim
    saved = torch.Tensor.reshape, torch.Tensor.repeat_interleave
    reshape, repeat = saved

    def from_official() -> bool:
        return sys._getframe(2).f_code.co_filename == prune_file

    def head_size_reshape(self, *shape):
        if from_official() and shape and shape[-1] == 128:
            shape = (*shape[:-1], head_dim)
        return reshape(self, *shape)

    def head_size_repeat(self, repeats, *args, **kwargs):
        if from_official() and repeats == 128:
            repeats = head_dim
        return repeat(self, repeats, *args, **kwargs)

    torch.Tensor.reshape = head_size_reshape
    torch.Tensor.repeat_interleave = head_size_repeat
    try:
        yield
    finally:
        torch.Tensor.reshape, torch.Tensor.repeat_interleave = saved


def flap_args(switches: str, nsamples: int) -> types.SimpleNamespace:
    """main.py's arguments for these switches (its defaults otherwise)."""
    return types.SimpleNamespace(
        model="smollm2-llama", seed=0, nsamples=nsamples,
        pruning_ratio=float(switch(switches, "--pruning_ratio", "0")),
        remove_heads=int(switch(switches, "--remove_heads", "8")),
        metrics=switch(switches, "--metrics", "WIFV"), structure=switch(switches, "--structure", "AL-AM"),
        prune_method=switch(switches, "--prune_method", "flap"), cache_dir="llm_weights",
        unstr="--unstr" in switches.split(), eval=False, save_model=None)


def run_flap(repo: Path, model, tokenizer, token_ids: torch.Tensor, switches: str) -> float:
    """`main.py <switches>` (`--prune_method flap|wanda_sp|mag_sp`, e.g. scripts/llama_7b.sh's
    `--pruning_ratio 0.2 --remove_heads -1 --metrics WIFV --structure AL-AM`) on `model`, a
    multi-head model (the code knows no key/value groups). As its `get_llm`, a zero bias is first
    added to o_proj and down_proj of every layer, in the weights' dtype (it loads float16)."""
    args = flap_args(switches, token_ids.shape[0])
    for layer in model.model.layers:
        for linear in (layer.self_attn.o_proj, layer.mlp.down_proj):
            linear.bias = torch.nn.Parameter(torch.zeros(linear.out_features, dtype=linear.weight.dtype))
    head_dim = model.model.layers[0].self_attn.head_dim
    with tempfile.TemporaryDirectory() as folder:
        official_copy(repo, FLAP_FILES, Path(folder))
        with importable(Path(folder)), cpu_shims(model, token_ids), \
                flap_shims(model, head_dim, str(Path(folder) / "lib" / "prune.py")):
            from lib import prune  # noqa: PLC0415  (imported inside the shims: its lib.data)

            pruner = {"flap": prune.prune_flap, "wanda_sp": prune.prune_wanda_sp,
                      "mag_sp": prune.prune_magnitude_sp}[args.prune_method]
            start = time.perf_counter()
            pruner(args, model, tokenizer, torch.device("cpu"))
            return time.perf_counter() - start


# ---- LLM-Pruner (horseee/LLM-Pruner, hf_prune.py --block_wise)

LLM_PRUNER_UNUSED = ("LLMPruner.models.hf_chatglm", "LLMPruner.models.hf_baichuan")


def official_files(repo: Path) -> list[str]:
    """hf_prune.py and every file of the LLMPruner package, as committed at HEAD."""
    names = subprocess.run(["git", "--git-dir", str(repo), "ls-tree", "-r", "--name-only", "HEAD", "LLMPruner"],
                           check=True, capture_output=True, text=True).stdout.split()
    return ["hf_prune.py", *names]


def copy_files(repo: Path, files: list[str], into: Path) -> None:
    for name in files:
        blob = subprocess.run(["git", "--git-dir", str(repo), "show", f"HEAD:{name}"], check=True,
                              capture_output=True).stdout
        (into / name).parent.mkdir(parents=True, exist_ok=True)
        (into / name).write_bytes(blob)


def official_model(modeling, dense, rope_base: float):
    """The official modeling file's LlamaForCausalLM holding `dense`'s (multi-head) weights, its
    rotary embeddings rebuilt with `rope_base` by the same file's class."""
    from transformers import LlamaConfig

    source = dense.config
    config = LlamaConfig(vocab_size=source.vocab_size, hidden_size=source.hidden_size,
                         intermediate_size=source.intermediate_size, num_hidden_layers=source.num_hidden_layers,
                         num_attention_heads=source.num_attention_heads,
                         num_key_value_heads=source.num_attention_heads, hidden_act=source.hidden_act,
                         max_position_embeddings=source.max_position_embeddings, rms_norm_eps=source.rms_norm_eps,
                         pad_token_id=source.pad_token_id, tie_word_embeddings=False)
    model = modeling.LlamaForCausalLM(config)
    state = dict(dense.state_dict())
    state.setdefault("lm_head.weight", dense.get_output_embeddings().weight)  # tied: the same values
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert all("rotary_emb" in k for k in missing + unexpected), (missing, unexpected)
    head_dim = source.hidden_size // source.num_attention_heads
    for layer in model.model.layers:
        layer.self_attn.rotary_emb = modeling.LlamaRotaryEmbedding(
            head_dim, max_position_embeddings=source.max_position_embeddings, base=rope_base)
    return model.float().eval()


@contextmanager
def patched(*targets):
    """Set (object, attribute, value) triples while inside; put the old values back after."""
    saved = [(obj, name, getattr(obj, name)) for obj, name, _ in targets]
    for obj, name, value in targets:
        setattr(obj, name, value)
    try:
        yield
    finally:
        for obj, name, value in saved:
            setattr(obj, name, value)


def hf_prune(copy_dir: Path, model, token_ids: torch.Tensor, switches: str) -> list[list[str]]:
    """hf_prune.py as a script, `--device cpu --eval_device cpu --num_examples N <switches>`, on
    `model` (the official modeling file's, pruned in place); returns each importance call's members
    (module name and handler), in the order the official group lists them."""
    import LLMPruner.datasets.example_samples as examples
    import LLMPruner.evaluator.ppl as ppl
    import transformers
    from LLMPruner.pruner import hf_llama_pruner

    names = {module: name for name, module in model.named_modules()}
    groups: list[list[str]] = []

    def spy(cls):
        call = cls.__call__

        def recorded(self, group, *args, **kwargs):
            groups.append([f"{names.get(dep.target.module, '?')}:{dep.handler.__name__}" for dep, _ in group])
            return call(self, group, *args, **kwargs)
        return recorded

    def examples_stub(dataset, tokenizer, n_samples, seq_len=128):
        assert dataset == "bookcorpus" and n_samples == token_ids.shape[0] and seq_len == token_ids.shape[1]
        return token_ids.clone()

    argv = ["hf_prune.py", "--base_model", "smollm2-135m-multi-head", "--device", "cpu", "--eval_device", "cpu",
            "--num_examples", str(token_ids.shape[0]), *switches.split(), "--save_ckpt_log_name", "official"]
    root = logging.getLogger()
    handlers = list(root.handlers)
    from LLMPruner.models.hf_llama import modeling_llama
    cwd = os.getcwd()
    with tempfile.TemporaryDirectory(prefix="llm-pruner-run-") as work, patched(
            (modeling_llama.LlamaForCausalLM, "from_pretrained", classmethod(lambda cls, *a, **k: model)),
            (transformers.LlamaTokenizer, "from_pretrained", classmethod(lambda cls, *a, **k: types.SimpleNamespace())),
            (examples, "get_examples", examples_stub), (ppl, "PPLMetric", lambda *a, **k: {}),
            (torch.cuda, "empty_cache", lambda: None), (torch.cuda, "memory_allocated", lambda *a, **k: 0),
            (hf_llama_pruner.TaylorImportance, "__call__", spy(hf_llama_pruner.TaylorImportance)),
            (hf_llama_pruner.MagnitudeImportance, "__call__", spy(hf_llama_pruner.MagnitudeImportance)),
            (sys, "argv", argv)):
        os.chdir(work)
        try:
            runpy.run_path(str(copy_dir / "hf_prune.py"), run_name="__main__")
        finally:
            os.chdir(cwd)
            for handler in root.handlers[:]:
                if handler not in handlers:
                    root.removeHandler(handler)
    return groups


@contextmanager
def llm_pruner_copy(repo: Path) -> Iterator[Path]:
    """hf_prune.py and the LLMPruner package as committed, importable while inside; the ChatGLM and
    Baichuan model packages (imported by `LLMPruner/models/__init__.py`, never used by the LLaMA
    path; their tokenizers need sentencepiece and transformers 4) are empty modules."""
    with tempfile.TemporaryDirectory(prefix="llm-pruner-official-") as folder, importable(Path(folder)):
        copy_files(repo, official_files(repo), Path(folder))
        for name in LLM_PRUNER_UNUSED:
            sys.modules[name] = types.ModuleType(name)
        try:
            yield Path(folder)
        finally:
            for name in [n for n in sys.modules if n == "LLMPruner" or n.startswith("LLMPruner.")]:
                del sys.modules[name]


def run_llm_pruner(repo: Path, model, tokenizer, token_ids: torch.Tensor, switches: str) -> float:
    """`hf_prune.py --device cpu --eval_device cpu --num_examples N <switches>` (e.g. `--block_wise
    --pruning_ratio 0.25 --pruner_type taylor --taylor param_first --block_attention_layer_start 0
    ...`) on a model of the official modeling file holding `model`'s (multi-head, float32)
    weights, its rotary embedding built with `model`'s rope base (`official_model`); the pruned
    decoder layers (the official file's modules) then replace `model`'s. `tokenizer` is unused (the
    calibration is `token_ids`, of the official seq_len 64)."""
    del tokenizer
    rope_base = model.config.rope_parameters["rope_theta"]
    with llm_pruner_copy(repo) as folder:
        from LLMPruner.models.hf_llama import modeling_llama  # noqa: PLC0415  (from the copy)

        official = official_model(modeling_llama, model, rope_base)
        start = time.perf_counter()
        hf_prune(folder, official, token_ids, switches)
        seconds = time.perf_counter() - start
    model.model.layers = official.model.layers
    return seconds


# ---- SliceGPT (microsoft/TransformerCompression, experiments/run_slicegpt.py's slicing steps)

SLICEGPT_ROUND_INTERVAL = 8  # run_slicegpt.py --round-interval
SLICEGPT_SEED = 0  # np.random.seed before rotate_and_slice (the script never seeds it; prunelab's seed)


def slicegpt_files(repo: Path) -> list[str]:
    """Every file of the official `src/slicegpt` package, as committed at HEAD."""
    return subprocess.run(["git", "--git-dir", str(repo), "ls-tree", "-r", "--name-only", "HEAD", "src/slicegpt"],
                          check=True, capture_output=True, text=True).stdout.split()


def ml_collections_stub() -> types.ModuleType:
    """`ml_collections` (imported by `slicegpt/config.py` for a `ConfigDict`, not installed here):
    a stub whose `ConfigDict` is an attribute namespace."""
    module = types.ModuleType("ml_collections")
    module.ConfigDict = type("ConfigDict", (types.SimpleNamespace,), {})
    return module


def transformers5_hooks(model) -> list:
    """Forward hooks on the official (compressed) layers for transformers 5: each attention's
    (output, weights) gets a third value, `None` (the official layer unpacks 3: transformers 4.41's
    cache), and each layer's 1-tuple output becomes its element (the hidden states transformers 5's
    `LlamaModel` expects). Their handles."""
    def three_outputs(_attention, _args, output):
        return (*output, None) if isinstance(output, tuple) and len(output) == 2 else output

    def hidden_states(_layer, _args, output):
        return output[0] if isinstance(output, tuple) else output

    handles = []
    for layer in model.model.layers:
        handles.append(layer.self_attn.register_forward_hook(three_outputs))
        handles.append(layer.register_forward_hook(hidden_states))
    return handles


def slicegpt_loader(token_ids: torch.Tensor, batch_size: int):
    """The calibration ids as `data_utils.prepare_dataloader`'s batches (input_ids, attention_mask,
    labels), in order."""
    from torch.utils.data import DataLoader

    rows = [{"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()} for ids in token_ids]
    return DataLoader(rows, batch_size=batch_size)


def slicegpt_slice(model, token_ids: torch.Tensor, sparsity: float, orientation: str, batch_size: int) -> float:
    """run_slicegpt.py's steps on `model` (a Llama, in place) with the official package importable:
    `LlamaModelAdapter` with what `_from_pretrained` and `hf_utils.get_model_and_tokenizer` set
    (`--dtype fp32`, `model.seqlen`, eval, no cache), `replace_layers`, `fuse_modules`, d =
    int((1 - sparsity) * hidden) minus d % 8 in a `ConstSlicingScheduler`, `np.random.seed(0)`, then
    `rotate_and_slice` (its default `apply_mask`). The transformers 5 hooks stay on the model (its
    forward needs them). Returns the seconds from `replace_layers` on."""
    import numpy as np
    from slicegpt import layernorm_fusion, rotate
    from slicegpt.adapters.llama_adapter import LlamaModelAdapter
    from slicegpt.slicing_scheduler import ConstSlicingScheduler

    model.config.torch_dtype = torch.float32
    adapter = LlamaModelAdapter(model)
    model.seqlen = model.config.max_position_embeddings
    model.eval()
    adapter.use_cache = False
    loader = slicegpt_loader(token_ids, batch_size)
    start = time.perf_counter()
    layernorm_fusion.replace_layers(adapter)
    transformers5_hooks(model)
    layernorm_fusion.fuse_modules(adapter)
    model.original_param_count = sum(int(p.nelement()) for p in model.parameters())  # the script's count
    dim = int((1 - sparsity) * adapter.hidden_size)
    dim -= dim % SLICEGPT_ROUND_INTERVAL
    np.random.seed(SLICEGPT_SEED)
    rotate.rotate_and_slice(adapter, loader, ConstSlicingScheduler(dim), final_orientation=orientation)
    return time.perf_counter() - start


@contextmanager
def slicegpt_copy(repo: Path) -> Iterator[Path]:
    """The official `src/slicegpt` package as committed, importable while inside (with the
    `ml_collections` stub: `config.device` is then the CPU, as the official code picks without CUDA)."""
    with tempfile.TemporaryDirectory(prefix="slicegpt-official-") as folder:
        official_copy(repo, slicegpt_files(repo), Path(folder))
        sys.modules.setdefault("ml_collections", ml_collections_stub())
        with importable(Path(folder) / "src"):
            yield Path(folder)


def run_slicegpt(repo: Path, model, tokenizer, token_ids: torch.Tensor, switches: str) -> float:
    """`run_slicegpt.py --dtype fp32 <switches>` (`--sparsity 0.25 --final-orientation pca
    --cal-batch-size 16`; its round interval 8) replayed with the official library functions on
    `model` (its Llama adapter takes only meta-llama names, and the script downloads its data):
    `slicegpt_slice`. The sliced model keeps the official compressed layers and their hooks."""
    del tokenizer
    with slicegpt_copy(repo):
        return slicegpt_slice(model, token_ids, float(switch(switches, "--sparsity", "0.0")),
                              switch(switches, "--final-orientation", "random"),
                              int(switch(switches, "--cal-batch-size", "16")))


#: method -> its official runner
RUNNERS = {"wanda": run_wanda, "ria": run_ria, "dsnot": run_dsnot, "dlp": run_dlp, "alps": run_alps,
           "flap": run_flap, "llm_pruner": run_llm_pruner, "slicegpt": run_slicegpt, "owl": run_owl}
