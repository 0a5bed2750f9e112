"""Facts about where a run ran: code version, libraries, hardware, the SLURM job, peak memory."""

from __future__ import annotations

import json
import os
import platform
import resource
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

from prunelab.models.checks import cpu_model  # noqa: F401  (re-exported)
from prunelab.models.memory import peak_rss, process_status_bytes, reset_peak_rss  # noqa: F401  (re-exported)

LIBRARIES = ("torch", "transformers", "tokenizers", "datasets", "lm_eval", "hydra-core", "omegaconf",
             "wandb", "accelerate", "safetensors", "numpy", "scipy", "pandas", "prunelab")


def git_state(cwd: str | Path | None = None) -> dict[str, Any]:
    """Commit sha and whether the work tree differs from it, when prunelab runs from a git checkout
    of its own source (an editable install); None otherwise. A wheel installed into a venv that sits
    inside some checkout is not that checkout's code, so the checkout must contain this package."""
    where = Path(cwd or Path(__file__).resolve().parent)
    try:
        top = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=where, capture_output=True,
                             text=True, timeout=10, check=True).stdout.strip()
        if cwd is None and Path(top) / "src" / "prunelab" != Path(__file__).resolve().parents[1]:
            return {"git_sha": None, "git_dirty": None}
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=where, capture_output=True, text=True,
                             timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=where,
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip()
        return {"git_sha": sha, "git_dirty": bool(dirty)}
    except (OSError, subprocess.SubprocessError):
        return {"git_sha": None, "git_dirty": None}


def package_info() -> dict[str, Any]:
    """prunelab's version and how it was installed: `editable` (a checkout), `vcs` (pip install
    git+URL: the commit pip recorded), `archive` (a wheel or sdist) or `source` (not installed)."""
    try:
        dist = metadata.distribution("prunelab")
    except metadata.PackageNotFoundError:
        return {"name": "prunelab", "version": None, "install": "source", "commit": None}
    info: dict[str, Any] = {"name": "prunelab", "version": dist.version, "install": "archive", "commit": None}
    direct = dist.read_text("direct_url.json")
    if direct:
        url = json.loads(direct)
        if url.get("dir_info", {}).get("editable"):
            info["install"] = "editable"
        elif "vcs_info" in url:
            info.update(install="vcs", commit=url["vcs_info"].get("commit_id"))
    return info


def library_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {}
    for name in LIBRARIES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def hardware() -> dict[str, Any]:
    """Where the run ran. `cpu_capability` is the SIMD level torch's CPU kernels dispatch to: two
    machines that differ in it (or in CPU) can round differently, enough to move a pruning mask."""
    return {"platform": platform.platform(), "cpu": platform.processor() or platform.machine(),
            "cpu_model": cpu_model(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"), **gpu_facts()}


def gpu_facts() -> dict[str, Any]:
    """The GPUs this process sees (`gpus`: name, memory, compute capability), the CUDA version torch
    was built with and the driver's: what a GPU timing or a rounding difference depends on."""
    if not torch.cuda.is_available():
        return {"gpus": [], "cuda": None, "cuda_driver": None}
    gpus = []
    for index in range(torch.cuda.device_count()):
        properties = torch.cuda.get_device_properties(index)
        gpus.append({"name": properties.name, "memory_bytes": int(properties.total_memory),
                     "capability": f"{properties.major}.{properties.minor}"})
    return {"gpus": gpus, "cuda": torch.version.cuda, "cuda_driver": cuda_driver_version()}


def cuda_driver_version() -> str | None:
    """The NVIDIA driver's version (nvidia-smi), or None where it cannot be asked."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return out.strip().splitlines()[0] if out.strip() else None


#: environment.slurm's fields and the SLURM variables they come from.
SLURM_FIELDS = {"job_id": "SLURM_JOB_ID", "array_job_id": "SLURM_ARRAY_JOB_ID",
                "array_task_id": "SLURM_ARRAY_TASK_ID", "job_name": "SLURM_JOB_NAME",
                "partition": "SLURM_JOB_PARTITION", "node": "SLURMD_NODENAME",
                "cluster": "SLURM_CLUSTER_NAME", "submit_dir": "SLURM_SUBMIT_DIR",
                "restart_count": "SLURM_RESTART_COUNT"}


def slurm_job() -> dict[str, Any] | None:
    """The SLURM job that ran this process (None outside SLURM), so a record names the job whose
    logs and `sacct` entry belong to it. `job` is the id `scancel` and `sacct -j` take (`<array job
    id>_<index>` for an array task); `stdout` and `stderr` are submitit's log files of that job, when
    submitit ran it."""
    if "SLURM_JOB_ID" not in os.environ:
        return None
    info: dict[str, Any] = {key: os.environ.get(var) for key, var in SLURM_FIELDS.items()}
    array = info["array_job_id"] is not None and info["array_task_id"] is not None
    info["job"] = f"{info['array_job_id']}_{info['array_task_id']}" if array else info["job_id"]
    info["stdout"] = info["stderr"] = None
    if "SUBMITIT_FOLDER" in os.environ:
        from submitit.core.utils import JobPaths

        paths = JobPaths(os.environ["SUBMITIT_FOLDER"], job_id=info["job"],
                         task_id=int(os.environ.get("SLURM_PROCID", 0)))
        info["stdout"], info["stderr"] = str(paths.stdout), str(paths.stderr)
    return info


def environment() -> dict[str, Any]:
    """Where and with what code the run ran. `git_sha` is the checkout's commit (editable installs)
    or the one pip recorded for `pip install git+URL`; `package` says which."""
    state, package = git_state(), package_info()
    if state["git_sha"] is None and package["commit"]:
        state = {"git_sha": package["commit"], "git_dirty": False}
    return {**state, "package": package, "python": sys.version.split()[0],
            "libraries": library_versions(), "hardware": hardware(), "slurm": slurm_job()}


def peak_memory() -> dict[str, int | None]:
    """Process peak resident memory (bytes) and, on CUDA, peak allocated device memory."""
    rss_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # kilobytes on Linux
    cuda = torch.cuda.max_memory_allocated() if torch.cuda.is_available() else None
    return {"cpu_rss_bytes": int(rss_kb) * 1024, "cuda_max_allocated_bytes": cuda}
