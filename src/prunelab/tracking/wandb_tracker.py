"""Weights & Biases: a run a researcher can read without opening the record.

- Names from the labels (`wanda-0.5-owl-smollm2_135m-seed0`), `group` = the setting across seeds
  (ending in the signature's first 6 hex digits), `job_type` = the method, tags (study, model,
  method, allocation or scorer, recovery); the full config and the signature in the run's config.
- Metrics stream as the stages finish: stage times, the dense baseline, one step per pruned layer
  (`prune/layer`, its measured sparsity, elapsed time), then the pruned metrics and their change
  over dense; the final values are put in the summary.
- Tables: per-layer sparsity (target and actual) and every zero-shot item (dense and pruned
  correctness, the pruned model's margin); the efficiency grid (prefill points and decode, dense
  and pruned medians, speedups); heatmaps of all-pairs layer matrices (WRP, swap-KL),
  drawn by the `matrix_figure` the tracker is given (conf/tracking/wandb.yaml names the study
  plots' `prunelab.analysis.plots.plot_matrix`: tracking draws nothing itself).
- Artifacts: the record (`result`, so `prunelab aggregate --wandb-project` can rebuild tables)
  and, with `save_model=true`, the saved model (`model`).

`mode: auto` logs online when credentials exist and otherwise offline (sync later with
`wandb sync`). Every call is guarded: a W&B failure is a warning, and the run goes on.
"""

from __future__ import annotations

import logging
import netrc
import os
from pathlib import Path
from typing import Any, Callable

import numpy as np

from prunelab.tracking.naming import RunNames
from prunelab.tracking.trackers import layer_matrices, scalar_metrics

log = logging.getLogger(__name__)

MODES = ("auto", "online", "offline", "disabled")


def wandb_credentials_exist() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        path = os.environ.get("NETRC", Path.home() / ".netrc")
        return netrc.netrc(path).authenticators("api.wandb.ai") is not None
    except (OSError, netrc.NetrcParseError):
        return False


def zeroshot_items(record: dict[str, Any]) -> tuple[list[str], list[list[Any]]]:
    """Columns and rows of the per-item zero-shot table: task, item, dense and pruned correct,
    the pruned model's margin (log-likelihood of the answer over the best other choice)."""
    metrics = record.get("metrics") or {}
    dense, pruned = metrics.get("dense") or {}, metrics.get("pruned") or {}
    rows: list[list[Any]] = []
    for key, metric in pruned.items():
        samples = metric.get("samples") or {}
        if not key.startswith("zeroshot/") or samples.get("unit") != "item":
            continue
        before = ((dense.get(key) or {}).get("samples") or {}).get("values") or [None] * len(samples["values"])
        margins = samples.get("margins") or [None] * len(samples["values"])
        task = key.split("/")[1]
        rows += [[task, i, b, v, m] for i, (b, v, m) in enumerate(zip(before, samples["values"], margins))]
    return ["task", "item", "dense_correct", "pruned_correct", "pruned_margin"], rows


def efficiency_grid(record: dict[str, Any]) -> tuple[list[str], list[list[Any]]]:
    """Columns and rows of the measured speed: each prefill grid point and the decode, with the
    dense and pruned medians and the speedup with the quartiles of its paired ratios."""
    section = record.get("efficiency") or {}
    if not section.get("measured"):
        return [], []
    columns = ["work", "batch", "tokens", "dense_median_s", "pruned_median_s", "speedup", "ratio_q25", "ratio_q75"]
    points = [("prefill", p, p["seqlen"]) for p in section["prefill"]]
    points.append(("decode", section["decode"], section["decode"]["new_tokens"]))
    return columns, [[work, p["batch"], tokens, p["dense"]["median_s"], p["pruned"]["median_s"], p["speedup"],
                      p["ratio_q25"], p["ratio_q75"]] for work, p, tokens in points]


class WandbTracker:
    """Attributes:
        project, entity: where runs go.
        mode: auto (online with credentials, else offline), online, offline or disabled.
        dir: where W&B writes its local files (offline runs land in <dir>/wandb/offline-run-*).
        tags: extra tags for every run.
        matrix_figure: draws an all-pairs layer matrix, `(matrix, title) -> matplotlib Figure`, or
            its dotted import path; None logs no heatmaps.
    """

    def __init__(self, project: str = "prunelab", entity: str | None = None, mode: str = "auto",
                 dir: str | None = None, tags: list[str] | None = None,
                 matrix_figure: Callable[[Any, str], Any] | str | None = None):
        from prunelab.errors import ConfigError

        if mode not in MODES:
            raise ConfigError(f"tracking.mode={mode!r}: use auto, online, offline or disabled")
        self.project, self.entity, self.mode, self.dir = project, entity, mode, dir
        self.tags = list(tags or [])
        if isinstance(matrix_figure, str):
            from hydra.utils import get_method

            try:
                matrix_figure = get_method(matrix_figure)
            except Exception:
                raise ConfigError(f"tracking.matrix_figure={matrix_figure!r} is not an importable function") from None
        self.matrix_figure = matrix_figure
        self.run = None

    def _resolved_mode(self) -> str:
        if self.mode != "auto":
            return self.mode
        if os.environ.get("WANDB_MODE"):
            return os.environ["WANDB_MODE"]
        if wandb_credentials_exist():
            return "online"
        log.warning("W&B: no credentials found, logging offline (sync later with `wandb sync`)")
        return "offline"

    def _guarded(self, what: str, action) -> None:
        if self.run is None:
            return
        try:
            action()
        except Exception as err:  # never lose the run because of tracking
            log.warning("W&B %s failed (%s: %s); the local record is unaffected", what, type(err).__name__, err)

    def start(self, names: RunNames, config: dict[str, Any]) -> None:
        try:
            import wandb

            if self.dir:
                Path(self.dir).mkdir(parents=True, exist_ok=True)
            self.run = wandb.init(project=self.project, entity=self.entity, mode=self._resolved_mode(),
                                  dir=self.dir, name=names.name, group=names.group, job_type=names.job_type,
                                  config=config, tags=self.tags + list(names.tags), reinit="finish_previous")
            self.run.define_metric("prune/layer")
            self.run.define_metric("prune/*", step_metric="prune/layer")
        except Exception as err:
            log.warning("W&B init failed (%s: %s); continuing without it", type(err).__name__, err)
            self.run = None

    def log(self, metrics: dict[str, Any]) -> None:
        self._guarded("log", lambda: self.run.log(metrics))

    def log_record(self, record: dict[str, Any], path: Path | None = None) -> None:
        self._guarded("logging the record", lambda: self._log_record(record, path))

    def _log_record(self, record: dict[str, Any], path: Path | None) -> None:
        import wandb

        final = scalar_metrics(record)
        sparsity = record.get("sparsity") or {}
        if sparsity.get("overall") is not None:
            final["sparsity/overall"] = sparsity["overall"]
        final.update({f"time/{stage}_s": seconds for stage, seconds in (record.get("timings") or {}).items()})
        tables: dict[str, Any] = {}
        if sparsity.get("per_layer"):
            tables["sparsity/per_layer"] = wandb.Table(
                columns=["layer", "target", "actual"],
                data=[[r["layer"], r["target"], r["actual"]] for r in sparsity["per_layer"]])
        columns, rows = zeroshot_items(record)
        if rows:
            tables["zeroshot/items"] = wandb.Table(columns=columns, data=rows)
        columns, rows = efficiency_grid(record)
        if rows:
            tables["efficiency/grid"] = wandb.Table(columns=columns, data=rows)
        for name, matrix in layer_matrices(record.get("pruning") or {}).items() if self.matrix_figure else ():
            figure = self.matrix_figure(matrix, name)
            figure.canvas.draw()
            tables[f"heatmap/{name}"] = wandb.Image(np.asarray(figure.canvas.buffer_rgba()))
        if tables:
            self.run.log(tables)
        self.run.summary.update({**final, "status": record.get("status"), "signature": record.get("signature"),
                                 "removed_layers": (record.get("pruning") or {}).get("removed_layers")})
        if path is not None:
            self._log_artifact(Path(path), f"record-{record['signature']}-seed{record['seed']}", "result",
                               {"status": record.get("status"), **(record.get("labels") or {})})

    def log_artifact(self, path: Path, name: str, kind: str, metadata: dict[str, Any]) -> None:
        self._guarded(f"logging the {kind} artifact", lambda: self._log_artifact(Path(path), name, kind, metadata))

    def _log_artifact(self, path: Path, name: str, kind: str, metadata: dict[str, Any]) -> None:
        import wandb

        artifact = wandb.Artifact(name=name, type=kind, metadata=metadata)
        if path.is_dir():
            artifact.add_dir(str(path))
        else:
            artifact.add_file(str(path))
        self.run.log_artifact(artifact)

    def finish(self, status: str) -> None:
        if self.run is None:
            return
        try:
            self.run.finish(exit_code=0 if status == "completed" else 1)
        except Exception as err:
            log.warning("W&B finish failed (%s: %s)", type(err).__name__, err)
        finally:
            self.run = None
