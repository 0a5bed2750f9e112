"""The Python API: prune and evaluate a model from a notebook in a few lines, or drive the same
runs as the CLI.

    import prunelab
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained("meta-llama/Llama-2-7b-hf", dtype="float16").cuda()
    tokenizer = AutoTokenizer.from_pretrained("meta-llama/Llama-2-7b-hf")
    report = prunelab.prune(model, tokenizer, method="wanda", sparsity=0.5, calibration="c4")
    metrics = prunelab.evaluate(model, tokenizer, data="wikitext2", evaluation="ppl")
    record = prunelab.run(["pruning=sparsegpt", "seed=1"])     # exactly what `prunelab ...` runs

Every method, allocation policy, depth scorer and recovery is built from the same packaged YAMLs
the CLI composes (`conf/`), so the defaults are the same faithful ones, and a keyword the
method does not have is the same one-line error. The CLI is a thin layer over `run_config`.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, open_dict

from prunelab.config import build, build_setup, compose_config, relabel_overridden_model
from prunelab.context import PruneContext
from prunelab.data import TokenCache, calibration_samples
from prunelab.data.tokens import random_windows
from prunelab.errors import ConfigError
from prunelab.models import wrap_model

log = logging.getLogger(__name__)


def run(overrides: Sequence[str] = ()) -> dict[str, Any]:
    """Compose the packaged configs with Hydra overrides and run the pipeline once, as
    `prunelab <overrides>` does; returns the result record (also written to records/).

    A sweep (`sweep=seeds3`, `seed=0,1,2`) is the CLI's job (`prunelab -m ...`); from Python, loop."""
    overrides = list(overrides)
    cfg = compose_config(overrides)
    relabel_overridden_model(cfg, overrides)
    return run_config(cfg)


def run_config(cfg: DictConfig, output_dir: Path | None = None,
               record_failed_setup: bool = False) -> dict[str, Any]:
    """One run of a composed config: what the CLI, `run` and a SLURM job all call.

    With `record_failed_setup` (runs of a sweep), a config that does not build (a bad input file)
    still leaves a `failed` record, stage `setup`, where the run's record belongs."""
    from prunelab.pipeline import run as run_pipeline

    try:
        setup = build_setup(cfg, output_dir)
    except Exception as err:
        if record_failed_setup:
            _record_failed_setup(cfg, err)
        raise
    return run_pipeline(setup)


def _record_failed_setup(cfg: DictConfig, err: Exception) -> None:
    from prunelab.config import resolved
    from prunelab.tracking.unstarted import write_unstarted

    try:
        path = write_unstarted(resolved(cfg), "failed", "setup", type(err).__name__, str(err))
    except Exception as problem:  # an unresolvable config or an unwritable folder: the error stays
        log.warning("no record for this run's setup failure: %s", problem)
        return
    log.info("record: %s (failed)", path)


def prune(model: torch.nn.Module, tokenizer, method: str = "wanda", sparsity: float | None = None,
          calibration: torch.Tensor | Sequence[str] | str | None = None, *,
          allocation: str | None = None, refine: str | None = None, scorer: str | None = None,
          recovery: str | None = None,
          num_layers: int | None = None, nsamples: int | None = None, seqlen: int | None = None,
          seed: int = 0, batch_size: int = 1, progress: bool = True,
          cache_dir: str | Path | None = None, overrides: Sequence[str] = (),
          **options: Any) -> dict[str, Any]:
    """Prune an in-memory Hugging Face causal LM in place; returns what was done.

    Args:
        model, tokenizer: any supported architecture (Llama, Mistral, Qwen2/3, Gemma 3, GPT-NeoX, OPT),
            on the device it should compute on.
        method: a `pruning=` option: wanda, sparsegpt, magnitude, ria, alps, depth, dense, or a width
            method that cuts heads and MLP channels out of the modules: flap, wanda_sp,
            magnitude_sp (`ratio=0.2`, the reference's, or `params_removed=0.2`, the fraction of
            the model's parameters to remove), llm_pruner (Taylor importance, `ratio=0.25` in
            layers `layer_start`..`layer_end`); or slicegpt, which rotates and slices the hidden
            dimension (`sparsity=0.25`: the fraction of it sliced; `final_orientation="pca"`).
        sparsity: target sparsity of weight pruning (the YAML's default when None).
        calibration: token ids ([N, T] or [T]); a list of texts (tokenized and cut into `nsamples`
            random windows of `seqlen` tokens with `seed`); or a `data=` option name (testbed,
            realtext, c4, wikitext2). Data-free methods (magnitude) need none.
        allocation: a `pruning/allocation=` option (uniform, owl, pals, gradient, random, alpha).
        refine: a `pruning/refine=` option (dsnot) refining the method's mask (wanda, ria,
            sparsegpt, magnitude).
        scorer, num_layers: for method="depth", a `pruning/scorer=` option and how many layers go.
        recovery: a `recovery=` option after depth pruning (linear_patch_r, replaceme, ghosted).
        nsamples, seqlen: calibration size: for a data option its YAML's default when None, for
            texts the references' 128 x 2048 (texts too short for one window are an error).
        overrides: further Hydra overrides (`pruning.allocation.lam=0.1`).
        **options: the method's own settings (`sparsity_type="2:4"`, `ties="exact"`, ...).

    Returns:
        {"labels", "sparsity" (overall and per layer), "parameters" (dense, pruned), "pruning"
        (removed layers, allocation, scores, recovery), "timings", "pruning_cost" (each stage's
        forward and backward passes over the calibration data)}: the record's pruning part.
    """
    from prunelab.pipeline import StageClock, prune_and_recover, pruning_cost, pruning_summary, seed_everything
    from prunelab.pruning.report import parameter_counts

    groups = [f"pruning={method}"]
    groups += [f"pruning/allocation={allocation}"] if allocation else []
    groups += [f"pruning/refine={refine}"] if refine else []
    groups += [f"pruning/scorer={scorer}"] if scorer else []
    groups += [f"recovery={recovery}"] if recovery else []
    data_option = calibration if isinstance(calibration, str) else None
    groups += [f"data={data_option}"] if data_option else []
    cfg = compose_config([*groups, *overrides])
    settings = {**options, **({"sparsity": sparsity} if sparsity is not None else {}),
                **({"num_layers": num_layers} if num_layers is not None else {})}
    set_keys(cfg, "pruning", settings)
    if data_option:
        set_keys(cfg, "data.calibration", {k: v for k, v in (("nsamples", nsamples), ("seqlen", seqlen))
                                           if v is not None})
    pruning, repair = build(cfg.pruning, "pruning"), build(cfg.recovery, "recovery")
    if getattr(repair, "requires_depth", False) and pruning.name != "depth":
        raise ConfigError(f"recovery={repair.name} repairs removed layers: use it with method='depth'")
    loaded = wrap_model(model, tokenizer)
    check_model = getattr(pruning, "check_model", None)  # a method that cannot prune this model refuses now
    if check_model is not None:
        check_model(loaded.adapter, loaded.spec.display_name)
    cache = Path(cache_dir).expanduser() if cache_dir else None
    source = calibration_source(calibration, cfg, tokenizer, seed, nsamples, seqlen, method, cache)
    drawn_tokens = [0]

    def draw() -> torch.Tensor:
        samples = source()  # [N, T]
        drawn_tokens[0] = samples.numel()
        return samples

    seed_everything(seed)
    ctx = PruneContext(loaded, seed, draw, batch_size, progress, cache)
    clock = StageClock()
    clock.layer_type = type(loaded.adapter.layers[0]) if loaded.adapter.num_layers else None
    dense_layers = loaded.adapter.num_layers
    dense_parameters = parameter_counts(loaded.adapter)
    start = time.perf_counter()
    report, recovered = prune_and_recover(ctx, pruning, repair, clock)
    clock.timings["total"] = time.perf_counter() - start
    summary = pruning_summary(loaded, report, recovered)
    return {"labels": {**pruning.labels(), "recovery": repair.name}, "sparsity": summary["sparsity"],
            "parameters": {"dense": dense_parameters, "pruned": summary["parameters_pruned"]},
            "pruning": summary["pruning"], "timings": clock.timings,
            "pruning_cost": pruning_cost(clock, dense_layers, drawn_tokens[0])}


def evaluate(model: torch.nn.Module, tokenizer, data: str | None = None,
             evaluation: str | None = None, *, progress: bool = True,
             cache_dir: str | Path | None = None, overrides: Sequence[str] = ()) -> dict[str, dict]:
    """Evaluate an in-memory model as a run's evaluate stage does.

    Args:
        data: a `data=` option naming the evaluation corpora (the default config's when None:
            testbed); `data=realtext` selects `evaluation=realtext` unless `evaluation` is given.
        evaluation: an `evaluation=` option (default, realtext, ppl, word_ppl, standard, standard_cpu, ghosted).
        overrides: further Hydra overrides (`evaluation.perplexity.max_windows=8`).

    Returns:
        metric key (`ppl/<corpus>/token`, `zeroshot/<task>/acc`, `zeroshot/average`) -> {"value",
        "higher_is_better", "protocol" (the stamp a paper table needs), "samples" (per window or
        item, for paired tests)}: the same dicts as a record's `metrics.pruned`.
    """
    from prunelab.pipeline import build_evaluators, evaluate_all

    groups = [f"data={data}"] if data else []
    groups += [f"evaluation={evaluation}"] if evaluation else []
    cfg = compose_config([*groups, *overrides])
    cache = TokenCache(Path(cache_dir).expanduser() / "tokens" if cache_dir else None)
    evaluators = build_evaluators(build(cfg.evaluation, "evaluation"), build(cfg.data, "data"), cache,
                                  progress)
    loaded = wrap_model(model, tokenizer)
    return {key: metric.to_dict() for key, metric in evaluate_all(evaluators, loaded).items()}


def set_keys(cfg: DictConfig, node: str, values: dict[str, Any]) -> None:
    """Set existing keys of a config node; an unknown key is a ConfigError naming close ones."""
    import difflib

    from omegaconf import OmegaConf

    target = OmegaConf.select(cfg, node)
    for key, value in values.items():
        if key not in target:
            close = difflib.get_close_matches(key, [str(k) for k in target.keys() if k != "_target_"], n=3)
            hint = f"; did you mean {' or '.join(close)}?" if close else ""
            raise ConfigError(f"{node} has no setting {key!r}{hint}")
        with open_dict(target):
            target[key] = list(value) if isinstance(value, tuple) else value


def calibration_source(calibration, cfg: DictConfig, tokenizer, seed: int, nsamples: int | None,
                       seqlen: int | None, method: str, cache_dir: Path | None):
    """The lazy calibration draw of `prune`: token ids as given, texts cut into random windows,
    or a data option's sampler. Drawn on first use, so data-free methods need none."""
    def draw() -> torch.Tensor:
        if calibration is None:
            raise ConfigError(f"method={method!r} needs calibration data: calibration=<token ids "
                              "[N, T]>, a list of texts, or a data option (testbed, realtext, c4, wikitext2)")
        if isinstance(calibration, torch.Tensor):
            ids = calibration.long()
            return ids.unsqueeze(0) if ids.dim() == 1 else ids  # [N, T]
        if isinstance(calibration, str):
            spec = build(cfg.data, "data").calibration
            return calibration_samples(spec, tokenizer, seed, TokenCache(cache_dir / "tokens" if cache_dir else None))
        texts = list(calibration)
        if not texts or not all(isinstance(t, str) for t in texts):
            raise ConfigError("calibration must be token ids, a non-empty list of texts or a data option name")
        from prunelab.data.tokens import encode

        ids = encode(tokenizer, "\n\n".join(texts))  # [1, L]
        return random_windows(ids, nsamples or 128, seqlen or 2048, random.Random(seed), "the calibration texts")

    return draw


def load(model: str = "testbed_llama", *, device: str | None = None, dtype: str | None = None,
         revision: str | None = None, cache_dir: str | Path | None = None) -> tuple[torch.nn.Module, Any]:
    """Model and tokenizer of anything a run can name, ready to evaluate or generate with.

        model, tokenizer = prunelab.load("smollm2_135m")               # a `model=` option
        model, tokenizer = prunelab.load("outputs/2026-12-03/10-00-00/model")  # a pruned checkpoint
        model, tokenizer = prunelab.load("meta-llama/Llama-2-7b-hf", device="cuda", dtype="float16")

    Args:
        model: a `model=` option (`testbed_llama`, `smollm2_135m`: its packaged GGUF is converted
            once into the cache), a folder or a hub id. A checkpoint written by `save_model=true`
            loads as it was saved: fewer layers after depth pruning, its recovery operators
            (Ghosted, LinearPatch) restored, per-layer widths after width pruning.
        device, dtype, revision: as `model.device`, `model.dtype`, `model.revision` (the option's
            own, or auto / float32 / the default branch, when None).
        cache_dir: where a GGUF is converted (`paths.cache_dir`: $PRUNELAB_CACHE or
            ~/.cache/prunelab when None).
    """
    from prunelab.config import group_options, model_preset
    from prunelab.models import ModelSpec, load_model

    changes = {key: value for key, value in (("device", device), ("dtype", dtype), ("revision", revision))
               if value is not None}
    if not isinstance(model, (str, Path)) or not str(model):
        raise ConfigError(f"prunelab.load takes a model= option, a folder or a hub id, not {model!r}")
    model = str(model)
    if model in (group_options("model") or []):
        spec = model_preset(model, **changes)
    else:
        spec = ModelSpec(name_or_path=model, **changes)
    loaded = load_model(spec, cache_dir=Path(cache_dir).expanduser() if cache_dir else None)
    return loaded.model, loaded.tokenizer


def shipped_model(name: str = "testbed_llama") -> str:
    """The folder of a model prunelab ships (testbed_llama, testbed_pythia), for from_pretrained."""
    from prunelab.models.spec import SHIPPED_MODELS, SHIPPED_ROOT

    if name not in SHIPPED_MODELS:
        raise ConfigError(f"no shipped model {name!r}; shipped: {', '.join(SHIPPED_MODELS)}")
    return str(SHIPPED_ROOT / name)


def summary_line(record: dict[str, Any]) -> str:
    """The run's last log line: each perplexity and the zero-shot average, against dense."""
    dense = record.get("metrics", {}).get("dense", {})
    parts = []
    for key, metric in record.get("metrics", {}).get("pruned", {}).items():
        if (key.startswith("zeroshot/") and key != "zeroshot/average") or key.startswith(("speedup/", "cost/")):
            continue  # the efficiency metrics are said once, in words, by efficiency_summary
        value, base = metric["value"], (dense.get(key) or {}).get("value")
        if base is None:
            parts.append(f"{key}={value:.4g}")
        elif key.startswith("ppl/"):
            parts.append(f"{key}={value:.4g} (dense {base:.4g}, {100 * (value / base - 1):+.1f}%)")
        else:
            parts.append(f"{key}={value:.4g} (dense {base:.4g}, {value - base:+.3f})")
    return ", ".join(parts + efficiency_summary(record)) or "no metrics"


def efficiency_summary(record: dict[str, Any]) -> list[str]:
    """'speedup prefill 1.25x, decode 1.24x', the FLOPs kept, and whether a sparse kernel ran."""
    section = record.get("efficiency") or {}
    if not section.get("measured"):
        return [f"efficiency not measured: {section['reason']}"] if section.get("reason") else []
    speed, counted = section["speedup"], section["counted"]["ratio"]
    parts = [f"speedup prefill {speed['prefill']:.2f}x, decode {speed['decode']:.2f}x",
             f"FLOPs {counted['flops_prefill']:.2f} and parameters {counted['parameters']:.2f} of dense"]
    if not section["sparse_kernels"]["used"] and section["sparse_kernels"]["reason"].startswith("no sparse kernel: PyTorch"):
        parts.append("no sparse kernel used")
    if (section["protocol"].get("machine_load") or {}).get("busy"):
        parts.append("timed on a busy machine")
    return parts
