"""What prunelab's submitit launchers do: `hydra/launcher=slurm` (GPU clusters), `slurm_cpu`
(clusters without GPUs or GRES) and `local_parallel` (one local process per run). Hydra only
instantiates launchers defined in `hydra_plugins`: the classes are in hydra_plugins/prunelab_launcher.

Hydra's submitit launcher submits every run of a sweep, then reads the jobs' results in order: the
first job that was cancelled or failed outside its run raises `UncompletedJobError`, so the command
ends in a traceback while later jobs still run, and a run that failed inside its job leaves the
exit code at 0. These launchers instead

- check the settings before submitting anything (cluster/checks.py): one line, exit 2;
- submit only the runs without a completed record (a relaunch of a finished sweep submits nothing);
- wait for every job and turn its end into an outcome (cluster/outcomes.py): the run's record,
  failed, interrupted, or "ended without a result" for a job that never reported back (cancelled
  while pending, killed, out of memory, a failed node; its state read from `sacct`), whose record
  the launching process then writes itself (tracking/unstarted.py), so every run has one;
- take each run's lease (tracking/lease.py) before submitting it and hand it to the run's job, so a
  relaunch, or a second sweep over the same records, never submits a run that a live job holds
  (running, pending, or interrupted and requeued): it names the owner in one line and waits for
  that run's record instead;
- follow a job SLURM requeues (preemption, `scontrol requeue`, a failed node with requeue on): its
  run's interrupted outcome only counts once `sacct` says the job ended for good; until then the
  command waits for the requeued job and reports the run by its final outcome (cluster/jobs.py);
- never requeue by itself: a job's end-of-allocation signals end its run as `interrupted`
  (interrupts.py) and relaunching the same command reruns exactly the runs that did not complete.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import sys
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, filter_overrides
from hydra_plugins.hydra_submitit_launcher import submitit_launcher as upstream
from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf
from omegaconf import OmegaConf, open_dict, read_write

from prunelab.cluster import checks, jobs, outcomes
from prunelab.cluster.claims import Claims
from prunelab.errors import ConfigError

log = logging.getLogger(__name__)

#: sacct states of a job whose allocation was taken away: its run counts as interrupted.
ENDED_BY_SLURM = ("CANCELLED", "TIMEOUT", "PREEMPTED", "DEADLINE", "NODE_FAIL", "BOOT_FAIL", "REQUEUED")


def _stop(err: ConfigError) -> None:
    print(f"prunelab: error: {err}", file=sys.stderr)
    sys.exit(2)


def _returned(overrides: Sequence[str], value: Any) -> JobReturn:
    """A JobReturn Hydra's sweeper reads without raising, whatever became of the run."""
    ret = JobReturn(overrides=list(overrides), status=JobStatus.COMPLETED)
    ret.return_value = value
    return ret


def last_error_line(text: str) -> str:
    """The exception line of the traceback in submitit's FailedJobError message."""
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("---")]
    errors = [line for line in lines if re.match(r"^[\w.]+(Error|Exception|Interrupt|Exit)\b", line)]
    return errors[-1] if errors else (lines[0] if lines else "no message")


def slurm_job_named(job) -> dict[str, Any]:
    """`environment.slurm` of a run whose SLURM job never wrote its record: what the launching
    process knows of that job (its id, array and log files)."""
    from prunelab.tracking.environment import SLURM_FIELDS

    array, _, task = job.job_id.partition("_")
    return {**dict.fromkeys(SLURM_FIELDS), "job": job.job_id, "array_job_id": array if task else None,
            "array_task_id": task or None, "job_id": None if task else array,
            "stdout": str(job.paths.stdout), "stderr": str(job.paths.stderr)}


def run_labels(job_overrides: Sequence[Sequence[str]]) -> list[str]:
    """Each run's overrides that tell it from the other runs of the batch ('seed=1')."""
    runs = [filter_overrides(list(o)) for o in job_overrides]
    shared = set.intersection(*(set(o) for o in runs)) if len(runs) > 1 else set()
    return [" ".join(o for o in overrides if o not in shared) or " ".join(overrides) for overrides in runs]


class WaitsForEveryJob(upstream.BaseSubmititLauncher):
    """`launch` as the module says; the job side (`__call__`) is Hydra's."""

    def check(self) -> None:
        """Settings checked before submission; a ConfigError ends the command in one line."""

    def checkpoint(self, *args: Any, **kwargs: Any) -> None:
        """No requeue from submitit's SIGUSR2 handler: a relaunch resumes a sweep (the records)."""
        return None

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        try:
            self.check()
        except ConfigError as err:
            _stop(err)
        labels = run_labels(job_overrides)
        self._claims = Claims(self._EXECUTOR)
        self._submitted: list = []  # jobs, as they are submitted
        returns: dict[int, JobReturn] = {}
        todo, held = [], []
        for n, overrides in enumerate(job_overrides):
            idx, config = initial_job_idx + n, self._run_config(list(overrides))
            run = (idx, list(overrides), labels[n], config)
            done = self._finished(config)
            lease = None
            if done is None and config is not None:
                lease = self._claims.take(config, idx, labels[n])
                if lease is None:
                    held.append(run)
                    continue
                done = self._finished(config)  # its previous owner may have completed it meanwhile
                if done is not None:
                    self._claims.release(config, lease)
            if done is not None:
                log.info("#%d %s: completed already, not submitted", idx, labels[n])
                returns[idx] = _returned(overrides, done)
            else:
                todo.append((*run, lease))
        if not todo and not held:
            log.info("every run of the sweep has a completed record: nothing to submit")
        submitted_at = datetime.now(timezone.utc).isoformat()
        jobs_: list = []
        try:
            jobs_ = self._submit(todo) if todo else []
        except KeyboardInterrupt:  # while runs waited for a free GPU (local_parallel)
            self._stopped_waiting(self._submitted)
        returns.update(self._wait_all(todo, jobs_, held, submitted_at))
        return [returns[initial_job_idx + n] for n in range(len(job_overrides))]

    def _run_config(self, overrides: list[str]) -> dict[str, Any] | None:
        """The run's resolved config (what its record keeps), or None if it does not compose: then
        the job is submitted and reports what is wrong."""
        from prunelab.config import relabel_overridden_model, resolved

        try:
            cfg = self.hydra_context.config_loader.load_sweep_config(self.config, overrides)
            task = list(cfg.hydra.overrides.task)
            with read_write(cfg), open_dict(cfg):
                del cfg["hydra"]
            relabel_overridden_model(cfg, task)
            return resolved(cfg)
        except Exception as err:  # the job will fail on it with the full message
            log.debug("could not compose %s before submission: %s", overrides, err)
            return None

    @staticmethod
    def _finished(config: dict[str, Any] | None) -> dict[str, Any] | None:
        """The run's completed record when the run would skip on it (runtime.skip_completed)."""
        if config is None or not config["runtime"].get("skip_completed", True):
            return None
        from prunelab.tracking.keep import finished_record
        from prunelab.tracking.unstarted import unstarted_record_path

        return finished_record(unstarted_record_path(config), bool(config.get("save_model")))

    def _executor(self):
        """submitit's executor for this launcher's parameters (hydra.launcher.*)."""
        import submitit

        params = dict(self.params)
        init = {"folder": params.pop("submitit_folder")}
        if "max_num_timeout" in params:
            init[f"{self._EXECUTOR}_max_num_timeout"] = params.pop("max_num_timeout")
        executor = submitit.AutoExecutor(cluster=self._EXECUTOR, **init)
        queue_keys = set(OmegaConf.structured(BaseQueueConf).keys())
        executor.update_parameters(**{k if k in queue_keys else f"{self._EXECUTOR}_{k}": v
                                      for k, v in self._queue_params(params).items()})
        return executor

    def _queue_params(self, params: dict[str, Any]) -> dict[str, Any]:
        """The parameters handed to submitit (the local launcher keeps its GPUs to itself)."""
        return params

    def _submit_runs(self, executor, runs: list, submitted: Callable[[tuple, Any], None]) -> None:
        """One job per run (a job array on SLURM), submitted at once; `submitted(run, job)` for each."""
        job_params = [(overrides, "hydra.sweep.dir", idx, f"job_id_for_{idx}", Singleton.get_state())
                      for idx, overrides, _, _, _ in runs]
        with self._claims.token_for_jobs(), contextlib.redirect_stderr(io.StringIO()):
            jobs = executor.map_array(self, *zip(*job_params))  # submitit echoes sbatch's refusal
        for run, job in zip(runs, jobs):
            submitted(run, job)

    def _submit(self, todo: list) -> list:
        from submitit.core.utils import FailedJobError, FailedSubmissionError

        executor = self._executor()
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        if "mode" in self.config.hydra.sweep:
            os.chmod(sweep_dir, mode=int(str(self.config.hydra.sweep.mode), 8))
        for idx, _, label, _, _ in todo:
            log.info("\t#%d : %s", idx, label)
        jobs: list = self._submitted

        def submitted(run: tuple, job) -> None:  # the run's lease goes to its job as soon as it exists
            _, _, _, config, lease = run
            if lease:
                self._claims.hand_to(config, lease, job)
            jobs.append(job)

        try:
            self._submit_runs(executor, todo, submitted)
        except BaseException as err:
            for _, _, _, config, lease in todo[len(jobs):]:  # a submitted run's job keeps its lease
                if lease:
                    self._claims.release(config, lease)
            if isinstance(err, (FailedJobError, FailedSubmissionError)):  # sbatch said no
                _stop(checks.submission_error(str(err)))
            raise
        arrays = sorted({job.job_id.split("_")[0] for job in jobs})
        log.info("submitted %d job(s) (%s %s); logs in %s/.submitit/", len(jobs),
                 "SLURM job" if self._EXECUTOR == "slurm" else "local job", ", ".join(arrays), sweep_dir)
        return jobs

    def _wait_all(self, todo: list, jobs_: list, held: list, submitted_at: str) -> dict[int, JobReturn]:
        """Every job's outcome, in order, then the runs held elsewhere; Ctrl-C stops waiting (the
        jobs keep running and keep their runs' leases)."""
        returns = {}
        try:
            for (idx, overrides, label, config, _), job in zip(todo, jobs_):
                returns[idx] = self._outcome(job, overrides, label, config, submitted_at)
            for idx, overrides, label, config in held:
                returns[idx] = self._wait_for_holder(overrides, label, config)
        except KeyboardInterrupt:
            self._stopped_waiting(jobs_)
        return returns

    @staticmethod
    def _stopped_waiting(jobs_: list) -> None:
        ids = " ".join(sorted({job.job_id.split("_")[0] for job in jobs_})) or "none submitted here"
        print(f"prunelab: stopped waiting; the sweep's jobs ({ids}) keep running and write their "
              "records (squeue lists them, scancel stops them); relaunching the same command submits "
              "just the runs without a completed record that no live job holds, and waits for the rest",
              file=sys.stderr)
        sys.exit(130)

    def _wait_for_holder(self, overrides: list[str], label: str, config: dict | None) -> JobReturn:
        """A run another live owner computes: wait until its lease is gone, then report its record."""
        from prunelab.tracking import read_record
        from prunelab.tracking.unstarted import unstarted_record_path

        self._claims.wait_for_holder(config)
        path = unstarted_record_path(config)
        record = read_record(path) or {}
        slurm_job = ((record.get("environment") or {}).get("slurm") or {}).get("job")
        if record.get("status") == "completed":
            log.info("%s: completed by %s", label, f"SLURM job {slurm_job}" if slurm_job else "another process")
            return _returned(overrides, record)
        failure, status = record.get("failure") or {}, record.get("status") or "failed"
        if not record:
            message = "its owner let go of it without a record"
        elif status == "interrupted" and failure.get("stage") != "job":
            message = f"interrupted ({failure.get('message')})"
        else:
            message = failure.get("message") if failure.get("stage") == "job" else \
                f"{failure.get('error_type')}: {failure.get('message')}"
        outcomes.note(status, label, f"{message} (not computed by this command)", slurm_job)
        return _returned(overrides, {"status": status, "message": message, "slurm_job": slurm_job})

    def _outcome(self, job, overrides: list[str], label: str, config: dict | None,
                 submitted_at: str) -> JobReturn:
        from submitit.core.utils import UncompletedJobError

        slurm_job = job.job_id if self._EXECUTOR == "slurm" else None
        while True:
            jobs.wait(job)
            try:
                ret = job.results()[0]
            except UncompletedJobError as err:  # also FailedJobError: no result from the run
                return self._without_result(job, err, overrides, label, config, submitted_at)
            if ret.status == JobStatus.FAILED:  # the run raised out of prunelab's entry (runtime.debug)
                error = ret._return_value
                value: Any = {"status": "failed", "message": f"{type(error).__name__}: {error}"}
            else:
                value = ret.return_value
            status = outcomes.status_and_message(value)[0]
            if not (slurm_job and status == "interrupted" and jobs.follow_requeue(job, label)):
                break  # a requeued job's new attempt is read again; otherwise this is the run's end
        if status == "skipped":  # the job found the run held by another live owner
            log.warning("%s: %s", label, value.get("message"))
            return self._wait_for_holder(overrides, label, config)
        if status == "interrupted" and slurm_job:  # its job ended for good: so does its lease
            self._claims.job_ended(config, job)
        completed = outcomes.note_returned(value, label, slurm_job)
        if not completed and config is not None and self._written_by(job, config, submitted_at) is None:
            self._record(job, config, *outcomes.status_and_message(value))  # stopped before its pipeline
        ret.status, ret.return_value = JobStatus.COMPLETED, value  # the sweeper re-raises FAILED
        return ret

    def _without_result(self, job, err: Exception, overrides: list[str], label: str,
                        config: dict | None, submitted_at: str) -> JobReturn:
        """A job that never reported back: say how it ended, and give its run a record."""
        from submitit.core.utils import FailedJobError

        state = (str(job.state) or "UNKNOWN").split()[0]
        written = self._written_by(job, config, submitted_at)
        if written and written.get("status") == "completed":  # killed after its record was written
            log.warning("#%s ended %s after its run completed: %s", label, state, job.paths.stderr)
            return _returned(overrides, written)
        if isinstance(err, FailedJobError):  # its process raised outside the run
            message = f"the job failed outside the run: {last_error_line(str(err))} (log: {job.paths.stderr})"
        elif not job.paths.stderr.exists():
            message = f"the job ended {state} before it started"
        else:
            message = f"the job ended {state} without a result (log: {job.paths.stderr})"
        status = "interrupted" if state in ENDED_BY_SLURM or "not requeued" in message else "failed"
        if config is not None and written is None:
            self._record(job, config, status, message, state)
        self._claims.job_ended(config, job)  # the job is over: nobody holds its run any more
        slurm_job = job.job_id if self._EXECUTOR == "slurm" else None
        outcomes.note(status, label, message, slurm_job)
        return _returned(overrides, {"status": status, "message": message, "slurm_job": slurm_job})

    @staticmethod
    def _written_by(job, config: dict | None, submitted_at: str) -> dict | None:
        """The run's record if this job wrote it: it names this SLURM job, or (local jobs, one
        clock) it started after the submission."""
        from prunelab.tracking import read_record
        from prunelab.tracking.unstarted import unstarted_record_path

        if config is None:
            return None
        existing = read_record(unstarted_record_path(config)) or {}
        slurm = (existing.get("environment") or {}).get("slurm") or {}
        if slurm.get("job"):
            return existing if slurm["job"] == job.job_id else None
        return existing if str(existing.get("started_at", "")) >= submitted_at else None

    def _record(self, job, config: dict, status: str, message: str, state: str | None = None) -> None:
        """The run's record, written here: its job never wrote one (see tracking/unstarted.py).
        `state`: how sacct says the job ended (`failure.job_state`)."""
        from prunelab.tracking.unstarted import write_unstarted

        try:
            path = write_unstarted(config, status, "job", "JobEndedWithoutResult", message,
                                   slurm_job_named(job) if self._EXECUTOR == "slurm" else None,
                                   state if self._EXECUTOR == "slurm" else None)
            log.info("record: %s (%s)", path, status)
        except Exception as problem:  # an unwritable folder: the line below still names the run
            log.warning("no record for this run: %s", problem)
