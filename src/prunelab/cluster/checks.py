"""What is checked before a sweep submits anything to SLURM, each a one-line ConfigError.

Without these the first sign of trouble is a traceback from submitit (no `srun` on PATH), an sbatch
error wrapped in one (a GPU request on a cluster without GRES: "Invalid generic resource (gres)
specification"; `mem_gb` above any node's memory: "Memory specification can not be satisfied"),
or a sweep that polls forever: submitit follows jobs through `sacct`, and without SLURM accounting
(slurmdbd) a job that ends without a result is never noticed.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Mapping
from typing import Any

from prunelab.errors import ConfigError

CPU_PRESET = "hydra/launcher=slurm_cpu"


def check_gpu_request(params: Mapping[str, Any]) -> None:
    """`hydra/launcher=slurm` is for GPU partitions: a partition and a GPU count are required."""
    extra = params.get("additional_parameters") or {}
    gpus = any(params.get(k) for k in ("gpus_per_node", "gpus_per_task", "gres")) or any(
        k in extra for k in ("gres", "gpus", "gpus_per_node", "gpus-per-node"))
    missing = [] if params.get("partition") else ["hydra.launcher.partition=<GPU partition>"]
    missing += [] if gpus else ["hydra.launcher.gpus_per_node=<GPUs per run>"]
    if missing:
        raise ConfigError(f"hydra/launcher=slurm needs {' and '.join(missing)} (`sinfo -o '%P %G'` "
                          f"lists partitions and their GPUs); on a cluster without GPUs use {CPU_PRESET}")


def check_slurm_reachable(timeout_s: float = 60) -> None:
    """sbatch and srun are on PATH and `sacct` answers (SLURM accounting is on)."""
    missing = [c for c in ("sbatch", "srun", "sacct") if shutil.which(c) is None]
    if missing:
        raise ConfigError(f"{', '.join(missing)} not found: submit SLURM sweeps from a machine of the "
                          "cluster (a login node), or run locally with hydra/launcher=local_parallel")
    try:
        result = subprocess.run(["sacct", "-n", "-X", "-S", "now", "-o", "JobID"], capture_output=True,
                                text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise ConfigError(f"sacct did not answer within {timeout_s:.0f} s: SLURM accounting "
                          "(slurmdbd) is unreachable, and submitit needs it to follow jobs") from None
    if result.returncode != 0:
        why = next((line.strip() for line in result.stderr.splitlines() if line.strip()), "no output")
        raise ConfigError(f"sacct fails ({why}): submitit follows jobs through SLURM accounting "
                          "(slurmdbd); without it a cancelled or killed job is never noticed")


def submission_error(stderr: str) -> ConfigError:
    """sbatch refused the jobs: its own line, with the usual fix."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    why = next((line for line in lines if "error" in line.lower()), lines[-1] if lines else "no output")
    why = why.removeprefix("sbatch: error: ")
    hint = ""
    if "gres" in why.lower():
        hint = f"; on a cluster without GPUs use {CPU_PRESET} (or hydra.launcher.gpus_per_node=null)"
    elif "memory" in why.lower():
        hint = "; lower hydra.launcher.mem_gb to what a node has (`sinfo -o '%P %m'`, in MB)"
    elif "partition" in why.lower():
        hint = "; `sinfo -s` lists the partitions"
    return ConfigError(f"sbatch refused the sweep's jobs: {why}{hint}")
