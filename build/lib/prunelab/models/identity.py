"""What identifies a model's dense weights, by content: cache keys and aggregate pairing use it.

A hub model is its commit hash; a local folder is the sha256 of its weight files' bytes (never their
names, sizes or times, so a retrained model saved over the old one is a different model).
"""

from __future__ import annotations

import hashlib
import json
from functools import lru_cache
from pathlib import Path
from typing import Any

WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.gguf")


@lru_cache(maxsize=64)
def _file_sha256(path: str, size: int, mtime_ns: int) -> str:
    """sha256 of a file's bytes (memoised within the process while the file is unchanged)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 24), b""):
            digest.update(block)
    return digest.hexdigest()


def file_sha256(path: str | Path) -> str:
    stat = Path(path).stat()
    return _file_sha256(str(Path(path).resolve()), stat.st_size, stat.st_mtime_ns)


def weight_file_hashes(folder: str | Path) -> list[tuple[str, str]]:
    """(name, sha256) of every weight file of a local checkpoint folder, sorted by name."""
    folder = Path(folder)
    files = sorted({p for pattern in WEIGHT_PATTERNS for p in folder.glob(pattern)})
    return [(p.name, file_sha256(p)) for p in files]


def identity_digest(identity: dict[str, Any]) -> str:
    """16-hex key of a model identity (as `model_identity` returns it)."""
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:16]
