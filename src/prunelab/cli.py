"""`prunelab`: the Hydra entry point. The config stops here; everything below gets typed objects.

    prunelab                                   # default: prune the shipped testbed model, evaluate
    prunelab model=llama2_7b pruning=wanda     # a hub model on a GPU
    prunelab -m seed=0,1,2 pruning.sparsity=0.5,0.6
    prunelab aggregate records/ --out results/my_study

Bad input (unknown group option, N:M with the wrong ratio, a ratio outside [0, 1), a missing path)
ends in one line on stderr and exit code 2, before any model is loaded.
"""

from __future__ import annotations

import difflib
import logging
import os
import sys
from pathlib import Path
from typing import Any

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.errors import InstantiationException
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from prunelab.errors import ConfigError, PrunelabError
from prunelab.interrupts import exit_code
from prunelab.pipeline import RunSetup, run

log = logging.getLogger("prunelab")


def config_dir() -> Path:
    """conf/ of the checkout (editable install), or $PRUNELAB_CONF."""
    if os.environ.get("PRUNELAB_CONF"):
        return Path(os.environ["PRUNELAB_CONF"]).resolve()
    return Path(__file__).resolve().parents[2] / "conf"


CONF_DIR = config_dir()


def group_options(group: str, conf_dir: Path = CONF_DIR) -> list[str] | None:
    """Options of a config group (yaml files in conf/<group>/), or None if it is not a group."""
    folder = conf_dir / group
    if not folder.is_dir():
        return None
    return sorted(p.stem for p in folder.glob("*.yaml"))


def model_preset(name: str, conf_dir: Path = CONF_DIR, **changes: Any):
    """The ModelSpec of a `model=` option (conf/model/<name>.yaml), for scripts and probes that
    load a model by its preset name outside a Hydra run; `changes` override its fields."""
    from prunelab.models import ModelSpec

    check_overrides([f"model={name}"], conf_dir)
    fields = OmegaConf.to_container(OmegaConf.load(conf_dir / "model" / f"{name}.yaml"))
    fields.pop("_target_", None)
    return ModelSpec(**{**fields, **changes})


def check_overrides(overrides: list[str], conf_dir: Path = CONF_DIR) -> None:
    """Unknown group options fail here with close names suggested (Hydra's own error is a wall)."""
    for override in overrides:
        if override.startswith("-") or "=" not in override:
            continue
        key, value = override.split("=", 1)
        group = key.lstrip("+~")
        options = group_options(group, conf_dir)
        if options is None or "(" in value or value in ("null", ""):
            continue
        for option in value.split(","):
            if option not in options:
                close = difflib.get_close_matches(option, options, n=3, cutoff=0.5)
                hint = f"; did you mean {' or '.join(close)}?" if close else ""
                raise ConfigError(f"unknown {group} option {option!r}{hint} (available: {', '.join(options)})")


def check_composes(overrides: list[str], conf_dir: Path = CONF_DIR) -> None:
    """A single run's overrides compose (Hydra's own error is several lines): a ConfigError of one.
    Skipped for multirun and Hydra flags, whose values Hydra checks per job."""
    if any(o.startswith("-") for o in overrides):
        return
    overrides = [o for o in overrides if not o.startswith("hydra")]
    from hydra import compose, initialize_config_dir
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        if any(o.is_sweep_override() for o in OverridesParser.create().parse_overrides(overrides)):
            return  # a sweep (pruning=a,b): Hydra composes each job
        with initialize_config_dir(config_dir=str(conf_dir), version_base="1.3"):
            compose("config", overrides=overrides)
    except Exception as err:  # Hydra's override and composition errors
        lines = [line.strip() for line in str(err).splitlines() if line.strip()][:2]
        raise ConfigError(" ".join(lines) or type(err).__name__) from None


def build(node: Any, where: str) -> Any:
    """Instantiate one config group; a bad or unused key is a ConfigError naming the group."""
    try:
        return hydra.utils.instantiate(node, _convert_="all")
    except InstantiationException as err:
        cause = err.__cause__
        if isinstance(cause, PrunelabError):
            raise cause from None
        message = str(cause or err).splitlines()[0]
        raise ConfigError(f"{where}: {message}") from None


def check_runtime(cfg: DictConfig) -> None:
    """Numbers that must be sensible before anything runs."""
    threads = cfg.runtime.threads
    if threads is not None and (not isinstance(threads, int) or threads < 1):
        raise ConfigError(f"runtime.threads={threads}: use null (torch's default) or a number >= 1")
    if not isinstance(cfg.seed, int) or cfg.seed < 0:
        raise ConfigError(f"seed={cfg.seed}: use a whole number >= 0")
    if cfg.runtime.calibration_batch_size < 1:
        raise ConfigError("runtime.calibration_batch_size must be >= 1")


def relabel_overridden_model(cfg: DictConfig, overrides: list[str]) -> None:
    """A run whose model.name_or_path is overridden is not labelled as the preset's model: unless
    model.label is given too, the label becomes the overridden path's last component."""
    keys = {o.split("=", 1)[0].lstrip("+~") for o in overrides if "=" in o}
    if "model.name_or_path" in keys and "model.label" not in keys and cfg.model.get("label"):
        with open_dict(cfg):
            cfg.model.label = None


def build_setup(cfg: DictConfig) -> RunSetup:
    try:
        config = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    except OmegaConfBaseException as err:
        raise ConfigError(str(err).splitlines()[0]) from None
    runtime = cfg.runtime
    check_runtime(cfg)
    if runtime.threads:
        torch.set_num_threads(int(runtime.threads))
    if not runtime.progress:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    try:
        output_dir = Path(HydraConfig.get().runtime.output_dir)
    except ValueError:  # not under Hydra (tests call build_setup directly)
        output_dir = None
    pruning, recovery = build(cfg.pruning, "pruning"), build(cfg.recovery, "recovery")
    if getattr(recovery, "requires_depth", False) and pruning.name != "depth":
        raise ConfigError(f"recovery={recovery.name} repairs removed layers: use it with pruning=depth")
    return RunSetup(
        model=build(cfg.model, "model"),
        data=build(cfg.data, "data"),
        pruning=pruning,
        recovery=recovery,
        evaluation=build(cfg.evaluation, "evaluation"),
        tracker=build(cfg.tracking, "tracking"),
        config=config,
        seed=int(cfg.seed),
        study=cfg.get("study"),
        records_dir=Path(cfg.paths.records_dir),
        cache_dir=Path(cfg.paths.cache_dir).expanduser() if cfg.paths.cache_dir else None,
        output_dir=output_dir,
        save_model=bool(cfg.save_model),
        progress=bool(runtime.progress),
        calibration_batch_size=int(runtime.calibration_batch_size),
        skip_completed=bool(runtime.skip_completed),
    )


def debug_enabled(cfg: DictConfig | None = None) -> bool:
    """PRUNELAB_DEBUG=1 or runtime.debug=true: errors keep their full traceback."""
    if os.environ.get("PRUNELAB_DEBUG", "") not in ("", "0"):
        return True
    return bool(cfg is not None and cfg.get("runtime", {}).get("debug", False))


def _fail(message: str, code: int = 2) -> None:
    print(f"prunelab: error: {message}", file=sys.stderr)
    sys.exit(code)


#: Runs of this process's multirun that failed and were passed over (`runtime.keep_going`).
FAILED_JOBS: list[str] = []


def _in_multirun() -> bool:
    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")
def hydra_entry(cfg: DictConfig) -> dict[str, Any] | None:
    try:
        relabel_overridden_model(cfg, list(HydraConfig.get().overrides.task))
        setup = build_setup(cfg)
        record = run(setup)
    except KeyboardInterrupt as err:  # Ctrl-C or SIGTERM (RunInterrupted): the record says interrupted
        if debug_enabled(cfg):
            raise
        _fail(f"interrupted ({getattr(err, 'signal_name', 'SIGINT')}); the record's status is "
              "interrupted, a relaunch runs it again", exit_code(err))
        return None
    except Exception as err:
        # One failed setting of a sweep should not cost the rest: its record says failed (stage,
        # error) and a relaunch retries it. A single run fails as usual.
        if _in_multirun() and cfg.runtime.get("keep_going", True):
            job = " ".join(HydraConfig.get().overrides.task)
            log.error("run failed, sweep goes on (%s): %s: %s", job, type(err).__name__, err)
            FAILED_JOBS.append(f"{job}: {type(err).__name__}: {err}")
            return None
        if isinstance(err, PrunelabError) and not debug_enabled(cfg):
            _fail(str(err))
            return None
        raise
    summary = ", ".join(f"{k}={v['value']:.4g}" for k, v in record["metrics"].get("pruned", {}).items()
                        if not k.startswith("zeroshot/") or k.endswith("average/acc"))
    log.info("done in %.1f s: %s", record["timings"]["total"], summary)
    return record


def main() -> None:
    argv = sys.argv[1:]
    if argv and argv[0] == "aggregate":
        from prunelab.analysis.cli import main as aggregate_main

        sys.exit(aggregate_main(argv[1:]))
    if not (CONF_DIR / "config.yaml").exists():
        _fail(f"config folder not found at {CONF_DIR}; install with `pip install -e .` from the "
              "checkout or set PRUNELAB_CONF")
    try:
        check_overrides(argv)
        check_composes(argv)
    except ConfigError as err:
        _fail(str(err))
    hydra_entry()
    if FAILED_JOBS:
        print(f"prunelab: {len(FAILED_JOBS)} run(s) of the sweep failed (records say why; "
              "relaunch to retry them):", file=sys.stderr)
        for job in FAILED_JOBS:
            print(f"  {job}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
