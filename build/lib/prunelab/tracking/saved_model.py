"""`save_model=true`: the pruned model folder appears whole or not at all.

The model and tokenizer are written to a temporary folder beside the record and renamed to
`model/` only when complete; a full disk or any other error removes the temporary folder and ends
in one `StorageError` line. An earlier `model/` is replaced only by a complete new one.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prunelab.errors import StorageError
from prunelab.files import storage_error

DISK_FULL_WORDS = ("No space left", "StorageFull", "File too large", "FileTooLarge", "Disk quota")


def save_model_folder(model, tokenizer, target: Path, save: Callable[[Any, Path], None]) -> Path:
    """save(model, folder) (recovery.boundary.save_recovered: weights plus any boundary operators)
    and the tokenizer, into a temporary folder renamed to `target` when complete."""
    target = Path(target)
    tmp = None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}-", suffix=".tmp"))
        save(model, tmp)
        tokenizer.save_pretrained(tmp)
        if target.exists():
            old = target.with_name(f".{target.name}-old-{os.getpid()}")
            os.replace(target, old)
            os.replace(tmp, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, target)
        tmp = None
    except OSError as err:
        raise storage_error(err, "the pruned model", target) from None
    except Exception as err:  # safetensors reports a full disk as its own error type
        if any(word in str(err) for word in DISK_FULL_WORDS):
            raise StorageError(f"no space left writing the pruned model to {target}; nothing "
                               "half-written was kept: free space or set save_model=false") from None
        raise
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def saved_model_present(record: dict) -> bool:
    """True when a record names a saved model folder that still holds weights."""
    folder = record.get("saved_model")
    return bool(folder) and any(Path(folder).glob("*.safetensors"))
