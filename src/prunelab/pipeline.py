"""One run: load -> allocate or score -> prune -> recover -> evaluate, timed, recorded, tracked.

The stage before `prune` is named for its work (`pruning.base.first_stage`): weight pruning
allocates per-layer target sparsities, depth pruning scores layers; the record's `timings` use
that name.

The pipeline never sees architecture details (those live in `models/`) nor Hydra config objects
(those stop at `cli`). Whatever happens, the run ends with one `result.json`; a failure records the
stage it happened in and the error, then re-raises.
"""

from __future__ import annotations

import logging
import random
import shutil
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import torch

from prunelab.calibration.runner import on_layer_done
from prunelab.calibration.work import counting_work
from prunelab.context import PruneContext, PruneReport
from prunelab.data import CalibrationSpec, DataSpec, TokenCache, calibration_samples
from prunelab.data.tokens import tokenize_long_texts_in_child
from prunelab.evaluation import EvaluationSpec, PerplexityEvaluator, dense_cache
from prunelab.evaluation.cost import count_cost, parameter_bytes
from prunelab.evaluation.efficiency import EfficiencyMeasurement
from prunelab.evaluation.metrics import Metric
from prunelab.errors import ConfigError
from prunelab.files import check_writable
from prunelab.interrupts import catch_termination
from prunelab.models import LoadedModel, cache_identity, identity_key, load_model, model_identity
from prunelab.models.loading import MemoryRequest
from prunelab.models.checks import free_bytes
from prunelab.models.offloaded_weights import has_offloaded_weights
from prunelab.models.memory import (
    GIB, default_state_bytes, peak_device_memory, reset_peak_device_memory, synchronize,
)
from prunelab.models.boundary_operators import save_recovered
from prunelab.pruning.base import PruningMethod, WeightPruning, first_stage
from prunelab.pruning.report import layer_sparsity, parameter_counts, sparsity_report
from prunelab.recovery.base import Recovery, RecoveryContext
from prunelab.recovery.plain_loading import save_for_plain_loading
from prunelab.cluster.jobs import verdict as slurm_verdict
from prunelab.tracking import Tracker, is_completed, read_record, run_names
from prunelab.tracking import lease as leases
from prunelab.tracking.attempts import with_attempts
from prunelab.tracking.trackers import scalar_metrics
from prunelab.tracking.keep import finished_record, write_keeping_completed
from prunelab.tracking.saved_model import save_model_folder
from prunelab.tracking.environment import environment, peak_memory, peak_rss, reset_peak_rss
from prunelab.tracking.record import SCHEMA_VERSION
from prunelab.run_setup import RunSetup

log = logging.getLogger(__name__)


class StageClock:
    """Times named stages, measures each one's peak resident memory, and remembers which one is
    running (for failure records). Given the model's decoder-layer type, it also counts each
    stage's work on those layers (`calibration.work`: tokens through them, backward passes)."""

    def __init__(self, on_done: Callable[[str, float], None] | None = None) -> None:
        self.timings: dict[str, float] = {}
        self.peak_rss: dict[str, int] = {}  # bytes, per stage (Linux; else the process's peak)
        self.work: dict[str, Any] = {}  # stage -> calibration.work.Work, for counted stages
        self.layer_type: type | None = None  # decoder layers whose work is counted
        self.reads: Callable[[], int] | None = None  # layers read from disk so far (a streamed model)
        self.layer_reads: dict[str, int] = {}  # per counted stage
        self.current: str | None = None
        self.on_done = on_done  # (stage, seconds) when a stage ends: the tracker streams it
        self.device: torch.device | None = None  # the model's: CUDA stages are synchronised and
        self.peak_device: dict[str, int] = {}  # their allocator peaks (bytes) reset at each start

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        self.current = name
        log.info("stage %s ...", name)
        reset_peak_rss()
        reset_peak_device_memory(self.device)  # synchronises: the queue of the stage before is not ours
        start = time.perf_counter()
        if self.layer_type is not None and name in WORK_STAGES:
            reads = self.reads() if self.reads else 0
            with counting_work(self.layer_type) as work:
                yield
            self.work[name] = work
            if self.reads:
                self.layer_reads[name] = self.reads() - reads
        else:
            yield
        synchronize(self.device)  # a CUDA stage has ended when its kernels have, not its launches
        self.timings[name] = self.timings.get(name, 0.0) + time.perf_counter() - start
        self.peak_rss[name] = max(self.peak_rss.get(name, 0), peak_rss())
        device_peak = peak_device_memory(self.device)
        if device_peak is not None:
            self.peak_device[name] = max(self.peak_device.get(name, 0), device_peak)
        log.info("stage %s done in %.1f s", name, self.timings[name])
        self.current = None
        if self.on_done is not None:
            self.on_done(name, self.timings[name])


#: The stages whose work on the model is counted: what pruning itself costs.
WORK_STAGES = ("allocate", "score", "prune", "recover")


def pruning_cost(clock: StageClock, num_layers: int, calibration_tokens: int) -> dict[str, Any]:
    """Each pruning stage's work beside its time: tokens through decoder layers, as forward and
    backward passes over the calibration data, backward calls, and layers read from disk (streamed)."""
    stages = {name: {**work.passes(num_layers, calibration_tokens), "seconds": clock.timings.get(name, 0.0),
                     **({"layers_read": clock.layer_reads[name]} if name in clock.layer_reads else {})}
              for name, work in clock.work.items()}
    total = {key: sum(stage.get(key, 0) for stage in stages.values())
             for key in ("layer_tokens", "forward_passes", "backward_passes", "backward_calls", "seconds")}
    return {"num_layers": num_layers, "calibration_tokens": calibration_tokens, "stages": stages, "total": total}


def plan_efficiency(setup: RunSetup, loaded: LoadedModel) -> tuple[EfficiencyMeasurement | None, str | None]:
    """The efficiency measurement the run makes (its dense model counted now, before pruning), or
    None with the reason. With `measure=always` a setting that cannot be measured is one line
    here, before any pruning; with `auto` (the default, for depth pruning) the run goes on and
    its record says why nothing was measured."""
    spec = setup.evaluation.efficiency
    if not spec.wanted(getattr(setup.pruning, "changes_shapes", False)):
        return None, None
    try:
        if loaded.mode == "streamed":
            raise ConfigError("a streamed model reads its layers from disk at every forward, so its speed "
                              "is the disk's; use model.streaming=false to measure it")
        sparsity_type = None if getattr(setup.pruning, "changes_shapes", False) else \
            setup.pruning.labels().get("sparsity_type")
        weights = parameter_bytes(loaded.model)[2]
        spec.check(loaded.model, loaded.device, sparsity_type, free_bytes(loaded.device), weights)
        dense_cost = count_cost(loaded.model, spec.decode_context)
    except ConfigError as err:
        if spec.measure == "always":
            raise ConfigError(f"evaluation.efficiency.measure=always: {err}") from None
        log.warning("efficiency not measured: %s", err)
        return None, str(err)
    return EfficiencyMeasurement(spec, loaded.device, sparsity_type, dense_cost, setup.progress), None


def measure_efficiency(measurement: EfficiencyMeasurement, setup: RunSetup, loaded: LoadedModel) -> dict[str, Any]:
    """The dense model loaded again beside the pruned one, both measured alternately."""
    dense = load_model(setup.model, setup.cache_dir).model.eval()
    try:
        return measurement.measure(dense, loaded.model.eval())
    finally:
        del dense


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def build_labels(setup: RunSetup) -> dict[str, Any]:
    calib: CalibrationSpec = setup.data.calibration
    return {"model": setup.model.display_name, **setup.pruning.labels(), "recovery": setup.recovery.name,
            "calibration": f"{calib.source}x{calib.nsamples}x{calib.seqlen}"}


def check_calibration_context(calib: CalibrationSpec, config) -> None:
    """Calibration sequences longer than the model's context fail in one line, before scoring."""
    limit = getattr(config, "max_position_embeddings", None)
    if limit and calib.seqlen > limit:
        raise ConfigError(f"data.calibration.seqlen={calib.seqlen} exceeds the model's context "
                          f"(max_position_embeddings={limit}); use data.calibration.seqlen<={limit}")


def memory_request(setup: RunSetup) -> MemoryRequest:
    """What the run holds besides the weights (calibration activations, the method's state per
    linear) and its budget: `load_model` streams under `model.streaming=auto` when the resident
    run would not fit, and refuses a run that cannot fit even streamed."""
    calib = setup.data.calibration
    state = getattr(setup.pruning, "layer_state_bytes", default_state_bytes)
    budget = int(setup.memory_budget_gb * GIB) if setup.memory_budget_gb else None
    work_dir = (Path(setup.output_dir) / "streamed_layers") if setup.output_dir else None
    gradients = any(getattr(part, "layer_gradients", False) for part in
                    (setup.pruning, getattr(setup.pruning, "scorer", None), getattr(setup.pruning, "allocation", None)))
    return MemoryRequest(calib.nsamples * calib.seqlen, setup.calibration_batch_size * calib.seqlen, state,
                         budget, work_dir, gradients, forward_checkpoint=setup.evaluation.zeroshot is not None,
                         rewrites_layers=isinstance(setup.pruning, WeightPruning) or setup.recovery.name != "none")


def check_streamable(setup: RunSetup) -> None:
    """What a streamed model cannot run yet: one line, before any work."""
    problems = []
    scorer = getattr(setup.pruning, "scorer", None)
    if getattr(setup.pruning, "streamable", True) is False:  # width pruning resizes the layers
        problems.append(f"pruning={setup.pruning.name}")
    elif not isinstance(setup.pruning, WeightPruning) and not getattr(scorer, "streamable", False):
        problems.append(f"pruning/scorer={getattr(scorer, 'name', setup.pruning.name)} (the README's "
                        "'Models larger than memory' lists the scorers that stream)")
    if setup.recovery.name != "none" and not getattr(setup.recovery, "streamable", False):
        problems.append(f"recovery={setup.recovery.name}")
    if problems:
        raise ConfigError(f"a streamed model (model.streaming) cannot yet run {', '.join(problems)}: "
                          "use model.streaming=false")


def check_offloadable(pruning: PruningMethod, recovery: Recovery) -> None:
    """What cannot run on weights accelerate offloaded (`model.max_memory`): one line, before any
    work. Layer-by-layer passes bring each layer's weights in (`models.offloaded_weights`); what
    reads every weight at once or back-propagates through the whole model cannot."""
    problems = []
    parts = {"pruning/allocation": getattr(pruning, "allocation", None),
             "pruning/scorer": getattr(pruning, "scorer", None), "recovery": recovery}
    if getattr(pruning, "streamable", True) is False:  # width pruning resizes every layer at once
        problems.append(f"pruning={pruning.name}")
    for group, part in parts.items():
        if part is not None and not getattr(part, "offloadable", True):
            problems.append(f"{group}={part.name}")
    if problems:
        raise ConfigError(f"weights offloaded by accelerate (model.max_memory) cannot yet run {', '.join(problems)}: "
                          "use model.streaming=true (layers read one at a time) or a larger model.max_memory")


def evaluate_all(evaluators: list, loaded: LoadedModel) -> dict[str, Metric]:
    metrics: dict[str, Metric] = {}
    for evaluator in evaluators:
        metrics.update(evaluator.evaluate(loaded.model, loaded.tokenizer))
    return metrics


def dense_metrics(evaluators: list, loaded: LoadedModel, cache_dir: Path | None) -> dict[str, dict]:
    """Dense metrics under the run's protocols, computed once per model and protocol (cached,
    checked before use: evaluation/dense_cache.py)."""
    stamps = {}
    for evaluator in evaluators:
        stamps.update(evaluator.protocol_stamps(loaded.model, loaded.tokenizer))
    identity = cache_identity(loaded)  # device and dtype too: a GPU bf16 run computes other numbers
    path = dense_cache.cache_file(cache_dir, identity, stamps) if cache_dir else None
    if path and path.exists():
        cached, problem = dense_cache.read_checked(path, identity, stamps)
        if cached is not None:
            log.info("dense metrics from cache %s", path)
            return cached
        log.warning("dense-metrics cache %s %s: recomputed", path, problem)
    metrics = {k: m.to_dict() for k, m in evaluate_all(evaluators, loaded).items()}
    if path:
        dense_cache.write(path, identity, stamps, metrics)
    return metrics


def build_evaluators(evaluation: EvaluationSpec, data: DataSpec, cache: TokenCache | None,
                     progress: bool = True) -> list:
    """The evaluators an evaluation spec asks for, on the data spec's corpora."""
    evaluators: list = []
    if evaluation.perplexity is not None:
        evaluators.append(PerplexityEvaluator(evaluation.perplexity, data.eval_corpora, data.eval_paths,
                                              cache, progress))
    if evaluation.zeroshot is not None:
        evaluators.append(evaluation.zeroshot.build(progress=progress))
    return evaluators


def prune_and_recover(ctx: PruneContext, pruning: PruningMethod, recovery: Recovery,
                      clock: StageClock) -> tuple[PruneReport, dict[str, Any]]:
    """allocate or score -> prune -> recover on ctx's model, in place, each stage timed."""
    if has_offloaded_weights(ctx.loaded.model):
        check_offloadable(pruning, recovery)
    stage, plan = first_stage(pruning)
    with clock(stage):
        planned = plan(ctx)  # layer targets (allocate) or layer scores (score)
    with clock("prune"):
        report = pruning.prune(ctx, planned)
    with clock("recover"):
        recovered = recovery.recover(RecoveryContext(ctx, report))
    return report, recovered


def pruning_summary(loaded: LoadedModel, report: PruneReport, recovered: dict[str, Any]) -> dict[str, Any]:
    """What pruning did, as the record keeps it: sparsity per layer, pruned parameter counts, the
    method's details (removed layers, allocation, scores) and the recovery's."""
    return {"sparsity": sparsity_report(loaded.adapter, report.layer_targets),
            "parameters_pruned": parameter_counts(loaded.adapter),
            "pruning": {"removed_layers": report.removed_layers, **report.details, "recovery": recovered}}


def stream_pruned_layer(tracker: Tracker, clock: StageClock, loaded: LoadedModel, desc: str,
                        index: int, total: int) -> None:
    """One tracker step per layer the prune stage finishes: its measured sparsity and the time."""
    if clock.current != "prune" or index >= loaded.adapter.num_layers:
        return
    tracker.log({"prune/layer": index, "prune/layer_sparsity": layer_sparsity(loaded.adapter, index),
                 "prune/layers_done": (index + 1) / total})


def run(setup: RunSetup) -> dict[str, Any]:
    """Run the pipeline once and return the record (also written to `setup.record_file`, or beside
    it when a completed record is there already: see tracking/keep.py).

    SIGTERM and SIGINT end the run with a record whose status is `interrupted`. The run holds its
    lease while it computes (tracking/lease.py): when another live process or SLURM job holds it,
    `RunHeld` (one line naming the owner) and nothing is computed."""
    with catch_termination():
        return _run(setup)


def _run(setup: RunSetup) -> dict[str, Any]:
    path = setup.record_file
    if setup.skip_completed and is_completed(path):
        done = finished_record(path, setup.save_model)
        if done is not None:
            log.info("already completed, skipping: %s (runtime.skip_completed=false reruns it)", path)
            return done
        log.warning("already completed but its model was not saved: running again to save it "
                    "(the completed record is kept aside)")
    check_writable(setup.records_dir, "the records folder")  # before any model is loaded
    if setup.evaluation.zeroshot is not None:
        setup.evaluation.zeroshot.check_data()  # offline benchmark splits present, before any model
    lease = leases.take(path, slurm_verdict)
    interrupted = False
    try:
        done = finished_record(path, setup.save_model) if setup.skip_completed else None
        if done is not None:  # the lease's previous owner completed it meanwhile
            log.info("completed meanwhile by another process, skipping: %s", path)
            return done
        with leases.heartbeat(path, lease):
            return _compute(setup)
    except KeyboardInterrupt:
        interrupted = True
        raise
    finally:
        if interrupted and lease["owner"].get("slurm_job"):
            leases.keep_for_requeue(path, lease)  # SLURM may run the job again: the job keeps the run
        else:
            leases.release(path, lease)


def _compute(setup: RunSetup) -> dict[str, Any]:
    """The run itself, under its lease: one record whatever happens."""
    path = setup.record_file
    previous = read_record(path)  # its attempts go on in this run's record
    record: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION, "status": "failed", "signature": setup.signature,
        "seed": setup.seed, "study": setup.study, "labels": build_labels(setup), "config": setup.config,
        "started_at": datetime.now(timezone.utc).isoformat(), "failure": None,
        "environment": environment(),
    }
    tracker = setup.tracker
    clock = StageClock(on_done=lambda stage, seconds: tracker.log({f"time/{stage}_s": seconds}))
    cache = TokenCache(setup.cache_dir / "tokens" if setup.cache_dir else None)
    tracker.start(run_names(record["labels"], setup.seed, setup.signature, setup.study),
                  {**setup.config, "signature": setup.signature})
    start = time.perf_counter()
    loaded: LoadedModel | None = None
    try:
        seed_everything(setup.seed)
        with clock("load"):
            loaded = load_model(setup.model, setup.cache_dir, memory_request(setup))
        clock.device = loaded.device
        if (loaded_peak := peak_device_memory(loaded.device)) is not None:
            clock.peak_device["load"] = loaded_peak  # the process's first stage on the device
        record["memory"] = {"mode": loaded.mode, **(loaded.memory or {})}
        check_calibration_context(setup.data.calibration, loaded.config)
        for stage in (setup.pruning, setup.recovery):  # a method that cannot prune or repair this model
            check_model = getattr(stage, "check_model", None)  # refuses here, before any evaluation or calibration
            if check_model is not None:
                check_model(loaded.adapter, setup.model.display_name)
        if loaded.mode == "streamed":
            check_streamable(setup)
            tokenize_long_texts_in_child(True)  # the encoding's freed heap would count against a data limit
            loaded.adapter.store.activation_budget_bytes = max(
                loaded.memory["estimate_bytes"]["activations"] if loaded.memory else 0, 1 << 28)
        record["model"] = {"identity": model_identity(loaded), "key": identity_key(loaded)}
        record["parameters"] = {"dense": parameter_counts(loaded.adapter)}
        with clock("efficiency"):  # the dense model's counted cost, and bad settings, before pruning
            efficiency, not_measured = plan_efficiency(setup, loaded)
        if not_measured:
            record["efficiency"] = {"measured": False, "reason": not_measured}
        clock.layer_type = type(loaded.adapter.layers[0]) if loaded.adapter.num_layers else None
        if loaded.adapter.store is not None:
            clock.reads = lambda: loaded.adapter.store.reads
        dense_layers = loaded.adapter.num_layers
        evaluators = build_evaluators(setup.evaluation, setup.data, cache, setup.progress)
        with clock("dense_eval"):
            record["metrics"] = {"dense": dense_metrics(evaluators, loaded, setup.cache_dir)}
        tracker.log(scalar_metrics(record))

        drawn: dict[str, torch.Tensor] = {}

        def calibration() -> torch.Tensor:
            if "samples" not in drawn:
                t0 = time.perf_counter()
                drawn["samples"] = calibration_samples(setup.data.calibration, loaded.tokenizer,
                                                       setup.seed, cache)
                clock.timings["data"] = time.perf_counter() - t0
            return drawn["samples"]

        ctx = PruneContext(loaded, setup.seed, calibration, setup.calibration_batch_size, setup.progress,
                           setup.cache_dir)
        with on_layer_done(partial(stream_pruned_layer, tracker, clock, loaded)):
            report, recovered = prune_and_recover(ctx, setup.pruning, setup.recovery, clock)
        summary = pruning_summary(loaded, report, recovered)
        calib = setup.data.calibration
        record["pruning_cost"] = pruning_cost(clock, dense_layers, calib.nsamples * calib.seqlen)
        record["sparsity"], record["pruning"] = summary["sparsity"], summary["pruning"]
        record["parameters"]["pruned"] = summary["parameters_pruned"]
        with clock("evaluate"):
            record["metrics"]["pruned"] = {k: m.to_dict() for k, m in evaluate_all(evaluators, loaded).items()}
        if efficiency is not None:
            with clock("efficiency"):
                record["efficiency"] = {"measured": True, **measure_efficiency(efficiency, setup, loaded)}
            record["metrics"]["pruned"].update({k: m.to_dict() for k, m in efficiency.metrics().items()})
        tracker.log(scalar_metrics(record))
        if setup.save_model:
            with clock("save"):
                save = partial(save_for_plain_loading, save=save_recovered)  # recovery/plain_loading.py
                if loaded.mode == "streamed":  # shard by shard, one layer in memory
                    save = partial(save_for_plain_loading, save=partial(
                        save_recovered, save_weights=loaded.adapter.store.save_checkpoint))
                record["saved_model"] = str(save_model_folder(
                    loaded.model, loaded.tokenizer, path.parent / "model", save))
            tracker.log_artifact(Path(record["saved_model"]), f"model-{setup.signature}-seed{setup.seed}",
                                 "model", record["labels"])
        record["status"] = "completed"
    except BaseException as err:
        record["status"] = "interrupted" if isinstance(err, KeyboardInterrupt) else "failed"
        record["failure"] = {"stage": clock.current or "setup", "error_type": type(err).__name__,
                             "message": str(err), "traceback": traceback.format_exc()}
        raise
    finally:
        tokenize_long_texts_in_child(False)
        clock.timings["total"] = time.perf_counter() - start
        peaks = peak_memory()
        peaks["cpu_rss_bytes"] = max([peaks["cpu_rss_bytes"] or 0, *clock.peak_rss.values()])
        if clock.peak_device:  # the allocator's peak is reset per stage: the run's is their largest
            peaks["cuda_max_allocated_bytes"] = max(clock.peak_device.values())
        record.update(timings=clock.timings, peak_memory=peaks,
                      finished_at=datetime.now(timezone.utc).isoformat())
        if "memory" in record:
            record["memory"]["stage_peak_rss_bytes"] = dict(clock.peak_rss)
            if clock.peak_device:
                record["memory"]["stage_peak_cuda_bytes"] = dict(clock.peak_device)
        store = loaded.adapter.store if loaded is not None else None
        if store is not None:
            record["memory"].update(layer_reads=store.reads, layer_writes=store.writes)
            store.close()
        written = write_keeping_completed(path, with_attempts(record, previous))
        if setup.output_dir is not None and Path(setup.output_dir).resolve() != path.parent.resolve():
            Path(setup.output_dir).mkdir(parents=True, exist_ok=True)
            shutil.copyfile(written, Path(setup.output_dir) / "result.json")
        tracker.log_record(record, written)
        tracker.finish(record["status"])
        log.info("record: %s (%s)", written, record["status"])
    return record
