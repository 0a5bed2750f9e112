"""The packaged Hydra configs: where they are, how overrides are checked and composed, and how a
composed config becomes the typed `RunSetup` of one run.

The configs live in `conf/` of the repository and ship inside the package as `prunelab/conf/` (the
package `prunelab.conf`), so a wheel installed anywhere composes them. A user's own groups and options come in through Hydra's search path: `--config-dir DIR` on
the command line, or `PRUNELAB_CONF=DIR[:DIR...]` for the CLI and the Python API alike (the
`hydra_plugins.prunelab_searchpath` plugin prepends them, so a user's option of the same name wins).
The CLI (`prunelab.cli`) and the Python API (`prunelab.api`) both compose and build here.
"""

from __future__ import annotations

import difflib
import importlib.util
import os
import re
from pathlib import Path
from typing import Any

import hydra
import torch
from hydra.errors import InstantiationException
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from prunelab.errors import ConfigError, PrunelabError



def _packaged_conf() -> Path:
    """The folder of the package `prunelab.conf`: `conf/` of a checkout (editable install; pyproject
    maps the package there), `prunelab/conf/` of an installed wheel."""
    spec = importlib.util.find_spec("prunelab.conf")
    if spec is None or not spec.submodule_search_locations:
        raise PrunelabError("the packaged configs (prunelab.conf) are missing; reinstall prunelab")
    return Path(next(iter(spec.submodule_search_locations))).resolve()


#: The packaged configs (package data of the wheel).
PACKAGE_CONF = _packaged_conf()
#: Kept for scripts written against earlier versions: the packaged config folder.
CONF_DIR = PACKAGE_CONF


def user_config_dirs() -> list[Path]:
    """The folders of $PRUNELAB_CONF (os.pathsep-separated), searched before the packaged configs."""
    value = os.environ.get("PRUNELAB_CONF", "")
    return [Path(p).expanduser().resolve() for p in value.split(os.pathsep) if p]


def config_dirs() -> list[Path]:
    """Every folder configs are composed from, highest priority first."""
    return [*user_config_dirs(), PACKAGE_CONF]


def group_options(group: str, conf_dirs: list[Path] | None = None) -> list[str] | None:
    """Options of a config group (yaml files in <dir>/<group>/ of any config folder), or None if it
    is not a group anywhere."""
    folders = [d / group for d in (conf_dirs or config_dirs()) if (d / group).is_dir()]
    if not folders:
        return None
    return sorted({p.stem for folder in folders for p in folder.glob("*.yaml")})


def option_file(group: str, name: str) -> Path:
    """The yaml of option `name` of `group`, from the highest-priority folder that has it."""
    check_overrides([f"{group}={name}"])
    return next(d / group / f"{name}.yaml" for d in config_dirs() if (d / group / f"{name}.yaml").is_file())


def model_preset(name: str, **changes: Any):
    """The ModelSpec of a `model=` option (conf/model/<name>.yaml), for scripts and probes that
    load a model by its preset name outside a Hydra run; `changes` override its fields."""
    from prunelab.models import ModelSpec

    fields = OmegaConf.to_container(OmegaConf.load(option_file("model", name)))
    fields.pop("_target_", None)
    return ModelSpec(**{**fields, **changes})


def check_overrides(overrides: list[str], conf_dirs: list[Path] | None = None) -> None:
    """Unknown group options fail here with close names suggested (Hydra's own error is a wall)."""
    for override in overrides:
        if override.startswith("-") or "=" not in override:
            continue
        key, value = override.split("=", 1)
        group = key.lstrip("+~")
        options = group_options(group, conf_dirs)
        if options is None or "(" in value or value in ("null", ""):
            continue
        for option in value.split(","):
            if option not in options:
                close = difflib.get_close_matches(option, options, n=3, cutoff=0.5)
                hint = f"; did you mean {' or '.join(close)}?" if close else ""
                raise ConfigError(f"unknown {group} option {option!r}{hint} (available: {', '.join(options)})")


def compose_config(overrides: list[str] | tuple[str, ...] = (), return_hydra_config: bool = False) -> DictConfig:
    """The run config the CLI would compose for these overrides (Hydra's compose API; sweep
    settings are ignored; `return_hydra_config`: with the `hydra` node, its sweeper params and
    group choices); a bad override is a one-line ConfigError with close keys suggested."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    overrides = list(overrides)
    check_overrides(overrides)
    if GlobalHydra.instance().is_initialized():
        GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(PACKAGE_CONF), version_base="1.3"):
            return compose("config", overrides=overrides, return_hydra_config=return_hydra_config)
    except Exception as err:  # Hydra's override and composition errors
        raise ConfigError(composition_message(err, overrides)) from None


MULTIRUN_FLAGS = ("-m", "--multirun")


def check_composes(overrides: list[str]) -> None:
    """The overrides compose (Hydra's own error is several lines): a ConfigError of one. In a
    sweep, the config every run starts from (the sweep's choices left out, as Hydra composes it);
    other Hydra flags are left to Hydra."""
    if any(o.startswith("-") and o not in MULTIRUN_FLAGS for o in overrides):
        return
    overrides = [o for o in overrides if not o.startswith("-") and not o.startswith("hydra")]
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except Exception as err:
        raise ConfigError(composition_message(err, overrides)) from None
    plain = [o.input_line for o in parsed if not o.is_sweep_override()]
    swept = [o.get_key_element() for o in parsed if o.is_sweep_override()]
    try:
        compose_config(plain)
    except ConfigError as err:
        raise ConfigError(per_run_setting_hint(str(err), plain, swept) or str(err)) from None


def per_run_setting_hint(message: str, plain: list[str], swept: list[str]) -> str | None:
    """A setting of a method the sweep chooses per run (`arm=flap,depth_sleb
    pruning.params_removed=0.2`) is not in the config every run starts from (the default method's):
    Hydra's advice, `+key`, then fails in every run whose method has it; `++key` is what works."""
    match = re.search(r"Could not override '([^']+)'", message)
    if not match or "." not in match.group(1):
        return None
    key = match.group(1)
    group = key.split(".", 1)[0]
    override = next((o for o in plain if o.split("=", 1)[0] == key), None)
    if override is None:
        return None
    rest = [o for o in plain if o != override]
    try:
        cfg = compose_config(rest, return_hydra_config=True)
        swept = swept + [str(k) for k in (OmegaConf.select(cfg, "hydra.sweeper.params") or {})]
        chosen = OmegaConf.select(cfg, f"hydra.runtime.choices.{group}") or "its default"
    except Exception:
        return None
    by = [k for k in swept if k in ("arm", group)]
    if not by:
        return None
    return (f"{key} is not a setting of {group}={chosen}, which every run of this sweep starts from; "
            f"the sweep chooses {group} per run ({', '.join(by)}): write ++{override} (each run "
            f"whose {group} has it takes it)")


def composition_message(err: Exception, overrides: list[str]) -> str:
    """Hydra's error in one line; a misspelled key gets the close keys of its node suggested."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()][:2]
    message = " ".join(lines) or type(err).__name__
    if "Could not override 'pruning.refine'" in message:
        return "pruning.refine is a config group: select it with pruning/refine=dsnot"
    if "Could not override 'pruning/refine'" in message:
        return ("pruning/refine refines a weight mask: use it with pruning=wanda, ria, sparsegpt or "
                "magnitude (the chosen method produces no mask to refine)")
    match = re.search(r"Could not override '([^']+)'|Key '([^']+)' is not in struct", message)
    key = next((o.split("=", 1)[0].lstrip("+~") for o in overrides
                if match and o.split("=", 1)[0].lstrip("+~") in (match.group(1), match.group(2))), None)
    hint = close_keys(key, [o for o in overrides if not o.split("=", 1)[0].lstrip("+~") == key]) if key else ""
    return f"{message}{hint}"


def close_keys(key: str, other_overrides: list[str]) -> str:
    """'; did you mean pruning.sparsity?' for pruning.sparsty, from the keys the config has."""
    from hydra import compose, initialize_config_dir

    parent, _, leaf = key.rpartition(".")
    try:
        with initialize_config_dir(config_dir=str(PACKAGE_CONF), version_base="1.3"):
            cfg = compose("config", overrides=[o for o in other_overrides if not o.startswith("hydra")])
        node = OmegaConf.select(cfg, parent) if parent else cfg
    except Exception:
        return ""
    if not isinstance(node, DictConfig):
        return ""
    close = difflib.get_close_matches(leaf, [str(k) for k in node.keys()], n=3, cutoff=0.6)
    return f"; did you mean {' or '.join(f'{parent}.{c}' if parent else c for c in close)}?" if close else ""


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
    budget = cfg.runtime.get("memory_budget_gb")
    if budget is not None and not (isinstance(budget, (int, float)) and budget > 0):
        raise ConfigError(f"runtime.memory_budget_gb={budget}: use null (detected) or a size in GB > 0")


def relabel_overridden_model(cfg: DictConfig, overrides: list[str]) -> None:
    """A run whose model.name_or_path is overridden is not labelled as the preset's model: unless
    model.label is given too, the label becomes the overridden path's last component."""
    keys = {o.split("=", 1)[0].lstrip("+~") for o in overrides if "=" in o}
    if "model.name_or_path" in keys and "model.label" not in keys and cfg.model.get("label"):
        with open_dict(cfg):
            cfg.model.label = None


def resolved(cfg: DictConfig) -> dict[str, Any]:
    """The run's config as plain data (what the record keeps), without Hydra's own node."""
    try:
        config = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    except OmegaConfBaseException as err:
        raise ConfigError(str(err).splitlines()[0]) from None
    config.pop("hydra", None)
    return config


def build_setup(cfg: DictConfig, output_dir: Path | None = None):
    """The typed RunSetup of a composed config (validated: a bad value is one ConfigError)."""
    from prunelab.run_setup import RunSetup

    config = resolved(cfg)
    runtime = cfg.runtime
    check_runtime(cfg)
    threads = runtime.threads or os.environ.get("SLURM_CPUS_PER_TASK")  # a SLURM job's own CPUs
    if threads:
        torch.set_num_threads(int(threads))
    if not runtime.progress:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
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
        memory_budget_gb=runtime.get("memory_budget_gb"),
    )
