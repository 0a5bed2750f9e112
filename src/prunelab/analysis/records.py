"""Find, read and flatten run records (`result.json`, see docs/result_record.md).

Why one module: every table, test and plot starts here, so an unreadable file is reported once
(one warning line), failed runs are counted but never averaged in, and copies of the same run
(Hydra's output folder keeps one next to records/) are counted once.

The flat form is a long pandas DataFrame, one row per (completed record, metric key); see
`records_to_frame` for its columns. `load_wandb_runs` turns W&B runs into the same records.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import pandas as pd

log = logging.getLogger(__name__)

RECORD_FILENAME = "result.json"
SUPPORTED_SCHEMA_VERSIONS = (1,)
COMPLETED, FAILED, INTERRUPTED = "completed", "failed", "interrupted"
LABEL_PREFIX = "labels."


class AnalysisError(ValueError):
    """A user-facing problem with the inputs (no records, unknown metric, bad baseline...)."""


@dataclass(frozen=True)
class RunRecord:
    """One run's record: where it came from (`source`, a path or wandb:entity/project/id) and its
    parsed JSON (`data`)."""

    source: str
    data: Mapping[str, Any]

    @property
    def signature(self) -> str:
        return str(self.data["signature"])

    @property
    def seed(self) -> int:
        return int(self.data["seed"])

    @property
    def status(self) -> str:
        return str(self.data.get("status"))

    @property
    def labels(self) -> Mapping[str, Any]:
        return self.data.get("labels") or {}

    def metrics(self, phase: str = "pruned") -> Mapping[str, Mapping[str, Any]]:
        """The `metrics[phase]` dict (phase is "pruned" or "dense"), empty when absent."""
        return (self.data.get("metrics") or {}).get(phase) or {}

    @property
    def name(self) -> str:
        """Short human name: signature/seed."""
        return f"{self.signature}/seed{self.seed}"


@dataclass
class LoadedRecords:
    """Records split by what tables may use: completed ones, failed ones (counted, excluded), and
    files that could not be read (with the reason)."""

    completed: list[RunRecord] = field(default_factory=list)
    failed: list[RunRecord] = field(default_factory=list)
    unreadable: list[tuple[str, str]] = field(default_factory=list)
    duplicates: int = 0

    def extend(self, other: "LoadedRecords") -> None:
        """Add another source's records; a run present in both is kept once."""
        merged = _deduplicated(LoadedRecords(
            self.completed + other.completed, self.failed + other.failed,
            self.unreadable + other.unreadable, self.duplicates + other.duplicates))
        self.completed, self.failed = merged.completed, merged.failed
        self.unreadable, self.duplicates = merged.unreadable, merged.duplicates

    def where(self, filters: Mapping[str, str]) -> "LoadedRecords":
        """The records whose labels match every `label: glob` filter (`model: gemma3*`)."""
        import fnmatch

        def keep(record: RunRecord) -> bool:
            return all(key in record.labels and fnmatch.fnmatchcase(str(record.labels[key]), pattern)
                       for key, pattern in filters.items())

        return LoadedRecords([r for r in self.completed if keep(r)], [r for r in self.failed if keep(r)],
                             self.unreadable, self.duplicates)

    def describe(self) -> str:
        """One line for humans: how many records of each kind were seen."""
        return (f"{len(self.completed)} completed record(s); {len(self.failed)} failed run(s) "
                f"excluded; {len(self.unreadable)} unreadable file(s) skipped; "
                f"{self.duplicates} duplicate copies ignored")


# --------------------------------------------------------------------------- files


def find_record_files(folders: Iterable[str | os.PathLike]) -> list[Path]:
    """All `result.json` files under the given folders (recursive), sorted; a folder argument may
    also be a result.json file or a run folder. Missing paths are warned about and skipped."""
    found: set[Path] = set()
    for folder in map(Path, folders):
        if folder.is_file():
            found.add(folder.resolve())
        elif folder.is_dir():
            found.update(path.resolve() for path in folder.rglob(RECORD_FILENAME) if path.is_file())
        else:
            log.warning("no such file or folder: %s", folder)
    return sorted(found)


def read_record(path: str | os.PathLike) -> RunRecord:
    """Parse and validate one result.json; raises AnalysisError saying what is wrong with it."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as error:
        raise AnalysisError(f"cannot read: {error}") from None
    except json.JSONDecodeError as error:
        raise AnalysisError(f"invalid JSON: {error}") from None
    return validate_record(data, str(path))


def validate_record(data: Any, source: str) -> RunRecord:
    """Check the fields tables rely on and wrap the record; raises AnalysisError otherwise."""
    if not isinstance(data, dict):
        raise AnalysisError("not a JSON object")
    version = data.get("schema_version")
    if version not in SUPPORTED_SCHEMA_VERSIONS:
        raise AnalysisError(f"unsupported schema_version {version!r}")
    missing = [key for key in ("status", "signature", "seed") if data.get(key) is None]
    if missing:
        raise AnalysisError(f"missing field(s): {', '.join(missing)}")
    if data["status"] not in (COMPLETED, FAILED, INTERRUPTED):  # interrupted: counted with failed
        raise AnalysisError(f"unexpected status {data['status']!r}")
    try:
        int(data["seed"])
    except (TypeError, ValueError):
        raise AnalysisError(f"seed is not an integer: {data['seed']!r}") from None
    if data["status"] == COMPLETED:
        metrics = data.get("metrics")
        if not isinstance(metrics, dict) or not isinstance(metrics.get("pruned"), dict):
            raise AnalysisError("completed record without metrics.pruned")
        for key, metric in metrics["pruned"].items():
            if not isinstance(metric, dict) or "value" not in metric:
                raise AnalysisError(f"metric {key!r} has no value")
    return RunRecord(source=source, data=data)


def load_records(folders: Iterable[str | os.PathLike]) -> LoadedRecords:
    """Read every result.json under `folders`.

    Unreadable files are skipped with one warning line each; failed runs are kept apart and
    summarised in one warning line; copies of the same (signature, seed) are counted once
    (the one that finished last is kept).
    """
    loaded = LoadedRecords()
    for path in find_record_files(folders):
        try:
            record = read_record(path)
        except AnalysisError as error:
            log.warning("skipping %s: %s", path, error)
            loaded.unreadable.append((str(path), str(error)))
            continue
        (loaded.completed if record.status == COMPLETED else loaded.failed).append(record)
    return _reported(_deduplicated(loaded))


# --------------------------------------------------------------------------- flat frame

FRAME_COLUMNS = ("source", "signature", "seed", "study", "status", "metric", "value",
                 "higher_is_better", "stamp", "protocol", "samples", "dense_value",
                 "dense_stamp", "dense_protocol", "dense_samples", "model_key")


def records_to_frame(records: Iterable[RunRecord] | LoadedRecords) -> pd.DataFrame:
    """Long frame, one row per (completed record, pruned metric key).

    Columns: source, signature, seed, study, status, labels.<name> (one per label seen),
    metric, value, higher_is_better, stamp (the protocol as canonical JSON, hashable, "" when
    absent), protocol (dict), samples (dict or None), and the dense reference of the same metric:
    dense_value, dense_stamp, dense_protocol, dense_samples, and model_key (the record's model
    identity digest, None in records older than it). Failed records are dropped.
    """
    if isinstance(records, LoadedRecords):
        records = records.completed
    rows = []
    for record in records:
        if record.status != COMPLETED:
            continue
        dense_metrics = record.metrics("dense")
        labels = {LABEL_PREFIX + key: _label_value(value) for key, value in record.labels.items()}
        for key, metric in record.metrics("pruned").items():
            dense = dense_metrics.get(key) or {}
            rows.append({
                "source": record.source, "signature": record.signature, "seed": record.seed,
                "study": record.data.get("study"), "status": record.status, **labels,
                "metric": key, "value": _as_float(metric.get("value")),
                "higher_is_better": metric.get("higher_is_better"),
                "stamp": stamp_key(metric.get("protocol")), "protocol": metric.get("protocol"),
                "samples": metric.get("samples"),
                "dense_value": _as_float(dense.get("value")),
                "dense_stamp": stamp_key(dense.get("protocol")),
                "dense_protocol": dense.get("protocol"), "dense_samples": dense.get("samples"),
                "model_key": (record.data.get("model") or {}).get("key"),
            })
    frame = pd.DataFrame(rows)
    label_columns = sorted((c for c in frame.columns if c.startswith(LABEL_PREFIX)),
                           key=label_order)
    ordered = list(FRAME_COLUMNS[:5]) + label_columns + list(FRAME_COLUMNS[5:])
    return frame.reindex(columns=ordered)


#: Label order in tables: the documented labels first, then the rest alphabetically.
KNOWN_LABELS = ("model", "method", "sparsity", "sparsity_type", "layers_removed", "allocation",
                "recovery", "calibration")


def label_order(column: str) -> tuple[int, str]:
    """Sort key for label columns: documented labels in their doc order, then alphabetical."""
    name = column.removeprefix(LABEL_PREFIX)
    return (KNOWN_LABELS.index(name) if name in KNOWN_LABELS else len(KNOWN_LABELS), name)


def label_columns(frame: pd.DataFrame) -> list[str]:
    """The frame's `labels.*` columns, in order."""
    return [column for column in frame.columns if str(column).startswith(LABEL_PREFIX)]


def label_varies(values: pd.Series) -> bool:
    """Whether a label takes more than one value across settings, a missing value counting as one
    (Wanda + DSnoT against Wanda: refine "dsnot" against none). pandas 3 keeps NaN missing through
    astype(str), so a plain nunique() no longer sees it."""
    return values.astype(str).nunique(dropna=False) > 1


def stamp_key(protocol: Mapping[str, Any] | None) -> str:
    """A protocol stamp as canonical JSON (sorted keys), so equal stamps compare and group equal."""
    return json.dumps(protocol, sort_keys=True, default=str) if protocol else ""


# --------------------------------------------------------------------------- W&B


class WandbCredentialsError(AnalysisError):
    """No W&B API key is configured; raised before any network access."""


def load_wandb_runs(project: str, entity: str | None = None,
                    filters: Mapping[str, Any] | None = None, api: Any = None) -> LoadedRecords:
    """Runs of a W&B project as records, for `records_to_frame` (the same row form as files).

    Each run's uploaded `result.json` is used when present (exact record, samples included);
    otherwise a record is rebuilt from the run's config and summary (values only: no samples or
    protocol stamps, so seed pairing across W&B-only rows trusts that the protocols match).
    Raises WandbCredentialsError, without network access, when no API key is configured.
    `api` lets tests pass a stand-in for wandb.Api().
    """
    if api is None:
        api = _wandb_api()
    path = f"{entity}/{project}" if entity else project
    loaded = LoadedRecords()
    for run in api.runs(path, filters=dict(filters or {})):
        source = f"wandb:{path}/{run.id}"
        try:
            data = _record_from_wandb_run(run)
            if data is None:
                continue
            record = validate_record(data, source)
        except AnalysisError as error:
            log.warning("skipping %s: %s", source, error)
            loaded.unreadable.append((source, str(error)))
            continue
        (loaded.completed if record.status == COMPLETED else loaded.failed).append(record)
    return _reported(_deduplicated(loaded))


def _wandb_api():
    import wandb  # imported lazily: it is slow and only needed here

    if not _wandb_has_credentials():
        raise WandbCredentialsError(
            "no W&B API key: set WANDB_API_KEY or run `wandb login` (no network access attempted)")
    try:
        return wandb.Api()
    except wandb.errors.UsageError as error:
        raise WandbCredentialsError(f"W&B: {error}") from None


def _wandb_has_credentials() -> bool:
    """True when an API key or identity token is configured (env, netrc, settings); no network."""
    if os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_IDENTITY_TOKEN_FILE"):
        return True
    try:
        from wandb.sdk import wandb_setup
        from wandb.sdk.lib import wbauth

        from wandb import env
    except ImportError:  # another wandb layout: let wandb.Api() decide
        return True
    host = env.get_base_url(wandb_setup.singleton().settings.base_url)
    auth = wbauth.authenticate_session(host=host, source="prunelab-aggregate", prompt=False,
                                       update_session=False)
    return auth is not None


_WANDB_STATES = {"finished": COMPLETED, "failed": FAILED, "crashed": FAILED, "killed": FAILED}


def _record_from_wandb_run(run: Any) -> dict[str, Any] | None:
    """The run's uploaded result.json, else a record rebuilt from config/summary; None for runs
    still running."""
    status = _WANDB_STATES.get(getattr(run, "state", "finished"))
    if status is None:
        return None
    uploaded = _uploaded_record(run)
    if uploaded is not None:
        return uploaded
    config = dict(getattr(run, "config", {}) or {})
    summary = dict(getattr(run, "summary", {}) or {})
    pruned, dense = {}, {}
    for key, value in summary.items():
        number = _as_float(value) if isinstance(value, (int, float)) else None
        if number is None or key.startswith("_"):
            continue
        for prefix, target in (("metrics/dense/", dense), ("dense/", dense),
                               ("metrics/pruned/", pruned), ("pruned/", pruned), ("", pruned)):
            if key.startswith(prefix) and key[len(prefix):].count("/") == 2:
                target[key[len(prefix):]] = {"value": number}
                break
    return {
        "schema_version": 1, "status": status,
        "signature": config.get("signature") or summary.get("signature") or run.id,
        "seed": config.get("seed", summary.get("seed")),
        "study": config.get("experiment") or config.get("study"),
        "labels": config.get("labels") or summary.get("labels") or {},
        "config": config, "metrics": {"pruned": pruned, "dense": dense},
    }


def _uploaded_record(run: Any) -> dict[str, Any] | None:
    try:
        files = [file for file in run.files() if Path(file.name).name == RECORD_FILENAME]
    except Exception as error:  # noqa: BLE001 - W&B client errors vary by version
        log.debug("cannot list files of run %s: %s", getattr(run, "id", "?"), error)
        return None
    if not files:
        return None
    with tempfile.TemporaryDirectory() as folder:
        files[0].download(root=folder, replace=True)
        return json.loads((Path(folder) / files[0].name).read_text(encoding="utf-8"))


# --------------------------------------------------------------------------- helpers


def _deduplicated(loaded: LoadedRecords) -> LoadedRecords:
    """Keep one record per (signature, seed): the latest finished_at, a completed one first."""
    chosen: dict[tuple[str, int], RunRecord] = {}
    for record in loaded.completed + loaded.failed:
        key = (record.signature, record.seed)
        if key not in chosen or _preference(record) > _preference(chosen[key]):
            chosen[key] = record
    duplicates = len(loaded.completed) + len(loaded.failed) - len(chosen)
    kept = sorted(chosen.values(), key=lambda r: (r.signature, r.seed, r.source))
    return LoadedRecords(
        completed=[r for r in kept if r.status == COMPLETED],
        failed=[r for r in kept if r.status != COMPLETED],
        unreadable=loaded.unreadable, duplicates=loaded.duplicates + duplicates)


def _reported(loaded: LoadedRecords) -> LoadedRecords:
    """Log duplicates (info) and failed runs (one warning line)."""
    if loaded.duplicates:
        log.info("ignored %d duplicate record copies (same signature and seed)", loaded.duplicates)
    if loaded.failed:
        names = ", ".join(_failure_summary(record) for record in loaded.failed[:5])
        more = f" and {len(loaded.failed) - 5} more" if len(loaded.failed) > 5 else ""
        log.warning("excluded %d failed run(s) from tables: %s%s", len(loaded.failed), names, more)
    return loaded


def _preference(record: RunRecord) -> tuple[bool, str]:
    return record.status == COMPLETED, str(record.data.get("finished_at") or "")


def _failure_summary(record: RunRecord) -> str:
    failure = record.data.get("failure") or {}
    reason = ":".join(str(failure[key]) for key in ("stage", "error_type") if failure.get(key))
    return f"{record.name} ({reason})" if reason else record.name


def _label_value(value: Any) -> Any:
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True)
    return value


def _as_float(value: Any) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def select_label_columns(names: Sequence[str], frame: pd.DataFrame, absent: str = "raise") -> list[str]:
    """Resolve user-given column names: `sparsity` or `labels.sparsity` both mean the label; other
    frame columns (signature, seed, study) are accepted as they are. A name no column has raises
    AnalysisError listing the labels; with `absent="skip"` (the row labels of a pivot or paper
    table) it is left out with a warning instead, so a study's layout naming a label of a part not
    run yet (RIA's `permutation`) still lays out the records there are."""
    resolved = []
    for name in names:
        name = name.strip()
        if not name:
            continue
        if name in frame.columns:
            resolved.append(name)
        elif LABEL_PREFIX + name in frame.columns:
            resolved.append(LABEL_PREFIX + name)
        else:
            known = ", ".join(c.removeprefix(LABEL_PREFIX) for c in frame.columns
                              if c.startswith(LABEL_PREFIX))
            if absent != "skip":
                raise AnalysisError(f"unknown label {name!r}; labels: {known}")
            log.warning("label %r is in no record (labels: %s): left out of the rows", name, known)
    return resolved


def log_table_to_wandb(table: pd.DataFrame, run: Any = None, key: str = "aggregate") -> Any:
    """Log a results frame (e.g. the summary) to a W&B run as a `wandb.Table` under `key`.

    `run` defaults to the active run (wandb.run). Cells that are not plain scalars (dicts,
    lists) are written as JSON text, NaN as empty. Returns the wandb.Table.
    """
    import wandb  # imported lazily: it is slow and only needed here

    run = run if run is not None else wandb.run
    if run is None:
        raise AnalysisError("no active W&B run: call wandb.init() or pass run=")
    rows = [[_wandb_cell(value) for value in row] for row in table.itertuples(index=False)]
    wandb_table = wandb.Table(columns=[str(c) for c in table.columns], data=rows)
    run.log({key: wandb_table})
    return wandb_table


def _wandb_cell(value: Any) -> Any:
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value, sort_keys=True, default=str)
    if value is None or value is pd.NA or (isinstance(value, float) and value != value):
        return None
    if hasattr(value, "item"):  # numpy scalar
        return value.item()
    return value
