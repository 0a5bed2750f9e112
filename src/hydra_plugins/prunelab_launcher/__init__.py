"""Hydra launcher plugins of prunelab, named by the `hydra/launcher` presets (Hydra instantiates
launchers only from the hydra_plugins package). What they do is prunelab.cluster.launcher's: check
before submitting, submit only unfinished runs, wait for every job, report each run that did not
complete."""

from prunelab.cluster import checks
from prunelab.cluster.launcher import WaitsForEveryJob


class LocalLauncher(WaitsForEveryJob):
    """`hydra/launcher=local_parallel`: every run in its own local process."""

    _EXECUTOR = "local"


class SlurmLauncher(WaitsForEveryJob):
    """`hydra/launcher=slurm_cpu`: SLURM jobs without GPUs; sbatch, srun and sacct must answer."""

    _EXECUTOR = "slurm"

    def check(self) -> None:
        checks.check_slurm_reachable()


class GpuSlurmLauncher(SlurmLauncher):
    """`hydra/launcher=slurm`: SLURM jobs on a GPU partition; partition and GPUs are required."""

    def check(self) -> None:
        checks.check_gpu_request(self.params)
        super().check()
