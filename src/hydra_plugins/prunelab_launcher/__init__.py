"""Hydra launcher plugins of prunelab, named by the `hydra/launcher` presets (Hydra instantiates
launchers only from the hydra_plugins package). What they do is prunelab.cluster.launcher's: check
before submitting, submit only unfinished runs, wait for every job, report each run that did not
complete."""

from typing import Any

from prunelab.cluster import checks, gpus
from prunelab.cluster.launcher import WaitsForEveryJob, log


class LocalLauncher(WaitsForEveryJob):
    """`hydra/launcher=local_parallel`: every run in its own local process, each with its own GPUs
    on a GPU machine (`hydra.launcher.gpus_per_node` per run, one by default; prunelab.cluster.gpus)."""

    _EXECUTOR = "local"

    def check(self) -> None:
        import torch

        self._gpus = gpus.visible_gpus()
        self._per_run = gpus.gpus_per_run(self.params.get("gpus_per_node"), self._gpus, torch.cuda.is_available())

    def _queue_params(self, params: dict[str, Any]) -> dict[str, Any]:
        return {**params, "gpus_per_node": 0}  # each job's GPUs are set when it is submitted

    def _submit_runs(self, executor, runs: list, submitted) -> None:
        if not self._per_run:  # the CPU: every run at once, no GPU visible to any
            super()._submit_runs(executor, runs, submitted)
            return
        slots = gpus.GpuSlots(gpus.gpu_groups(self._gpus, self._per_run))
        if len(runs) > len(slots.free):
            log.info("%d runs on %d group(s) of %d GPU(s): each run starts when a group is free",
                     len(runs), len(slots.free), self._per_run)
        for run in runs:
            group = slots.take()
            # submitit's AutoExecutor does not take visible_gpus: its local executor does
            executor._executor.update_parameters(gpus_per_node=len(group), visible_gpus=group)
            jobs = []
            super()._submit_runs(executor, [run], lambda run_, job: (jobs.append(job), submitted(run_, job)))
            slots.give(group, jobs[0])


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
