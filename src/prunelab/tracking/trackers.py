"""Experiment trackers: W&B (the default) and none. The local record never depends on them.

`tracking=wandb` logs online when credentials exist and otherwise offline (one notice; sync later
with `wandb sync`). Runs of one signature share a W&B group, so seeds of a setting group together.
Every tracker call is guarded: a W&B failure is logged as a warning and the run goes on.
"""

from __future__ import annotations

import logging
import netrc
import os
from pathlib import Path
from typing import Any, Protocol

import numpy as np

log = logging.getLogger(__name__)


class Tracker(Protocol):
    def start(self, name: str, group: str, config: dict[str, Any], tags: list[str]) -> None: ...
    def log_record(self, record: dict[str, Any], path: Path | None = None) -> None: ...
    def finish(self, status: str) -> None: ...


def layer_matrices(details: dict[str, Any], prefix: str = "") -> dict[str, list[list[Any]]]:
    """Square all-pairs layer matrices inside a record's `pruning` details (WRP similarity, swap-KL
    replacement and interchange distances), found one nesting level deep."""
    found: dict[str, list[list[Any]]] = {}
    for key, value in details.items():
        if isinstance(value, dict) and not prefix:
            found.update(layer_matrices(value, f"{key}/"))
        elif (isinstance(value, list) and len(value) > 1 and all(isinstance(r, list) for r in value)
              and all(len(r) == len(value) for r in value)):
            found[prefix + key] = value
    return found


class NoTracker:
    """`tracking=none`: nothing leaves the machine except the local record."""

    def start(self, name: str, group: str, config: dict[str, Any], tags: list[str]) -> None:
        pass

    def log_record(self, record: dict[str, Any], path: Path | None = None) -> None:
        pass

    def finish(self, status: str) -> None:
        pass


def wandb_credentials_exist() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        path = os.environ.get("NETRC", Path.home() / ".netrc")
        return netrc.netrc(path).authenticators("api.wandb.ai") is not None
    except (OSError, netrc.NetrcParseError):
        return False


class WandbTracker:
    """Weights & Biases.

    Attributes:
        project, entity: where runs go.
        mode: auto (online with credentials, else offline), online, offline or disabled.
        dir: where W&B writes its local files (offline runs land in <dir>/wandb/offline-run-*).
    """

    def __init__(self, project: str = "prunelab", entity: str | None = None, mode: str = "auto",
                 dir: str | None = None, tags: list[str] | None = None):
        if mode not in ("auto", "online", "offline", "disabled"):
            from prunelab.errors import ConfigError

            raise ConfigError(f"tracking.mode={mode!r}: use auto, online, offline or disabled")
        self.project, self.entity, self.mode, self.dir = project, entity, mode, dir
        self.tags = list(tags or [])
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

    def start(self, name: str, group: str, config: dict[str, Any], tags: list[str]) -> None:
        try:
            import wandb

            if self.dir:
                Path(self.dir).mkdir(parents=True, exist_ok=True)
            self.run = wandb.init(project=self.project, entity=self.entity, mode=self._resolved_mode(),
                                  dir=self.dir, name=name, group=group, config=config,
                                  tags=self.tags + tags, reinit="finish_previous")
        except Exception as err:  # never lose the run because of tracking
            log.warning("W&B init failed (%s: %s); continuing without it", type(err).__name__, err)
            self.run = None

    def log_record(self, record: dict[str, Any], path: Path | None = None) -> None:
        """Metrics, per-layer sparsity as a table, and the record file itself (so
        `prunelab aggregate --wandb-project` rebuilds the same tables from W&B)."""
        if self.run is None:
            return
        try:
            import wandb

            summary: dict[str, Any] = {}
            for phase in ("dense", "pruned"):
                for key, metric in (record.get("metrics", {}).get(phase) or {}).items():
                    summary[f"{phase}/{key}"] = metric["value"]
            sparsity = record.get("sparsity") or {}
            if sparsity.get("overall") is not None:
                summary["sparsity/overall"] = sparsity["overall"]
            for stage, seconds in (record.get("timings") or {}).items():
                summary[f"time/{stage}"] = seconds
            self.run.log(summary)
            if sparsity.get("per_layer"):
                table = wandb.Table(columns=["layer", "target", "actual"],
                                    data=[[r["layer"], r["target"], r["actual"]] for r in sparsity["per_layer"]])
                self.run.log({"sparsity/per_layer": table})
            for name, matrix in layer_matrices(record.get("pruning") or {}).items():
                from prunelab.analysis.plots import plot_matrix

                figure = plot_matrix(matrix, name)
                figure.canvas.draw()
                self.run.log({f"heatmap/{name}": wandb.Image(np.asarray(figure.canvas.buffer_rgba()))})
            self.run.summary["status"] = record.get("status")
            if path is not None:
                self.run.save(str(path), base_path=str(Path(path).parent), policy="now")
        except Exception as err:
            log.warning("W&B logging failed (%s: %s); the local record is unaffected", type(err).__name__, err)

    def finish(self, status: str) -> None:
        if self.run is None:
            return
        try:
            self.run.finish(exit_code=0 if status == "completed" else 1)
        except Exception as err:
            log.warning("W&B finish failed (%s: %s)", type(err).__name__, err)
        finally:
            self.run = None
