"""SIGTERM and SIGINT end a run as `RunInterrupted`, so its record says `interrupted`.

SLURM sends SIGTERM before it kills a job (at the time limit or on scancel); by default Python
would die at once without a record. Inside `catch_termination()` both signals raise
`RunInterrupted` in the main thread, the pipeline records the stage, and the CLI prints one line.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from prunelab.errors import RunInterrupted

SIGNALS = {signal.SIGTERM: "SIGTERM", signal.SIGINT: "SIGINT"}
EXIT_CODES = {"SIGTERM": 143, "SIGINT": 130}


def _raise(signum: int, _frame) -> None:
    raise RunInterrupted(SIGNALS.get(signum, str(signum)))


@contextmanager
def catch_termination() -> Iterator[None]:
    """Within the block, SIGTERM and SIGINT raise RunInterrupted (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, _raise) for sig in SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def exit_code(err: BaseException) -> int:
    """Shell convention: 128 + signal number."""
    return EXIT_CODES.get(getattr(err, "signal_name", "SIGINT"), 130)
