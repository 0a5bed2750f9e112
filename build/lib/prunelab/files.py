"""Writing files so that an error never leaves a half-written or temporary file behind.

Every cache and record goes through `atomic_write`: a temporary file in the target folder, fsync,
rename. A full disk or a read-only folder becomes one `StorageError` line.
"""

from __future__ import annotations

import errno
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO

from prunelab.errors import StorageError

#: errno values that mean "no room": full disk, quota, file size limit.
NO_SPACE = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def storage_error(err: OSError, what: str, path: str | Path) -> StorageError:
    """A one-line StorageError for an OSError raised while writing `what` to `path`."""
    if err.errno in NO_SPACE:
        return StorageError(f"no space left writing {what} to {path} ({err.strerror}); nothing "
                            "half-written was kept: free space or point paths.* elsewhere")
    if err.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return StorageError(f"cannot write {what} to {path}: {err.strerror}")
    return StorageError(f"cannot write {what} to {path}: {err.strerror or err}")


def atomic_write(path: str | Path, write: Callable[[IO[bytes]], None], what: str = "a file") -> Path:
    """Call write(handle) on a temporary file beside `path`, fsync and rename it into place."""
    path = Path(path)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}-", suffix=".tmp")
        with os.fdopen(fd, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except OSError as err:
        raise storage_error(err, what, path) from None
    finally:
        if tmp is not None and Path(tmp).exists():
            Path(tmp).unlink(missing_ok=True)
    return path


def check_writable(folder: str | Path, what: str) -> None:
    """Create `folder` if needed and prove a file can be written there (before expensive work)."""
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".write-check-")
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        raise StorageError(f"{what} {folder} is not writable ({err.strerror or err}); "
                           "set paths.records_dir to a writable folder") from None
