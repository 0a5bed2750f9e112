"""Read an offline W&B run back from its `run-*.wandb` file, as a test of what a user will see.

The file is W&B's transaction log: a 7-byte header (':W&B', magic, version), then 32 KiB blocks of
LevelDB-log records (crc32, length, type: full / first / middle / last), each a protobuf `Record`.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BLOCK = 32768
HEADER = 7


@dataclass
class OfflineRun:
    name: str = ""
    group: str = ""
    job_type: str = ""
    tags: list[str] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)  # one dict per logged step
    summary: dict[str, Any] = field(default_factory=dict)
    artifacts: list[tuple[str, str]] = field(default_factory=list)  # (name, type)


def records(path: Path) -> list[bytes]:
    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B transaction log"
    out, partial, pos = [], b"", HEADER
    while pos + 7 <= len(data):
        left = BLOCK - pos % BLOCK
        if left < 7:
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if length == 0 and kind == 0:  # zero padding to the end of a block
            pos += left
            continue
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind == 1:
            out.append(chunk)
        elif kind == 2:
            partial = chunk
        elif kind == 3:
            partial += chunk
        elif kind == 4:
            out.append(partial + chunk)
    return out


def _items(updates) -> dict[str, Any]:
    return {(u.key or "/".join(u.nested_key)): json.loads(u.value_json) for u in updates}


def read_offline_run(run_dir: Path) -> OfflineRun:
    from wandb.proto import wandb_internal_pb2 as pb

    [path] = list(Path(run_dir).glob("run-*.wandb"))
    run = OfflineRun()
    for raw in records(path):
        record = pb.Record()
        record.ParseFromString(raw)
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run.name, run.group, run.job_type = record.run.display_name, record.run.run_group, record.run.job_type
            run.tags = list(record.run.tags)
            run.config.update({u.key: json.loads(u.value_json) for u in record.run.config.update})
        elif kind == "history":
            run.history.append(_items(record.history.item))
        elif kind == "summary":
            run.summary.update(_items(record.summary.update))
        elif kind == "artifact":
            run.artifacts.append((record.artifact.name, record.artifact.type))
    return run
