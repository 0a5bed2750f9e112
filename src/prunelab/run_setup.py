"""The typed setup of one run: what `prunelab.config` builds from a composed config and
`prunelab.pipeline.run` runs. It sits below both, so neither imports the other."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prunelab.data import DataSpec
from prunelab.evaluation import EvaluationSpec
from prunelab.models import ModelSpec
from prunelab.pruning.base import PruningMethod
from prunelab.recovery.base import Recovery
from prunelab.tracking import Tracker, config_signature, record_path


@dataclass
class RunSetup:
    """Everything a run needs, typed; built by `cli` from the composed config."""

    model: ModelSpec
    data: DataSpec
    pruning: PruningMethod
    recovery: Recovery
    evaluation: EvaluationSpec
    tracker: Tracker
    config: dict[str, Any]  # the resolved config, for the record and the signature
    seed: int = 0
    study: str | None = None
    records_dir: Path = Path("records")
    cache_dir: Path | None = None
    output_dir: Path | None = None  # Hydra's run folder: gets a copy of the record
    save_model: bool = False
    progress: bool = True
    calibration_batch_size: int = 1
    skip_completed: bool = True
    memory_budget_gb: float | None = None  # runtime.memory_budget_gb; None: detected

    @property
    def signature(self) -> str:
        return config_signature(self.config)

    @property
    def record_file(self) -> Path:
        return record_path(self.records_dir, self.signature, self.seed)
