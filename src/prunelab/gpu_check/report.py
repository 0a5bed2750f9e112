"""The check's output: one table on stdout and one JSON file (the device, the versions, a row per
check: status, seconds, peak memory, detail)."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import torch

from prunelab.gpu_check.measure import Row
from prunelab.models.memory import readable_bytes


def device_facts(device: torch.device) -> dict[str, Any]:
    """What the numbers depend on: the device, torch and its CUDA, the other libraries, the host."""
    import prunelab
    from prunelab.models.checks import cpu_model
    from prunelab.tracking.environment import hardware, library_versions

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_model()
    return {"device": {"type": device.type, "name": name, "index": device.index},
            "torch": torch.__version__, "cuda": torch.version.cuda, "prunelab": prunelab.__version__,
            "libraries": library_versions(), "hardware": hardware(),
            "peak_memory_of": ("the CUDA allocator (torch.cuda.max_memory_allocated), per row" if device.type == "cuda"
                               else "the process's peak resident memory (VmHWM, reset per row)")}


def table(rows: list[Row]) -> str:
    from tabulate import tabulate

    body = [[row.check, row.status, "" if row.seconds is None else f"{row.seconds:.1f}",
             "" if row.peak_memory_bytes is None else readable_bytes(row.peak_memory_bytes), row.detail]
            for row in rows]
    return tabulate(body, headers=["check", "status", "seconds", "peak memory", "detail"],
                    maxcolwidths=[44, None, None, None, 90], disable_numparse=True)


def summary(rows: list[Row]) -> dict[str, Any]:
    counts = {status: sum(row.status == status for row in rows) for status in ("ok", "failed", "skipped")}
    return {**counts, "passed": counts["failed"] == 0,
            "failed_checks": [row.check for row in rows if row.status == "failed"]}


def write_json(path: Path, facts: dict[str, Any], options: dict[str, Any], rows: list[Row],
               seconds: float) -> Path:
    """Write the report atomically (a reader never sees half a file)."""
    document = {**facts, "options": options, "seconds": round(seconds, 1), **summary(rows),
                "rows": [row.as_dict() for row in rows]}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(handle, "w") as out:
        json.dump(document, out, indent=2, default=str)
    os.replace(temporary, path)
    return path
