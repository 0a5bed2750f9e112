"""SIGTERM, SIGUSR2 and SIGINT end a run as `RunInterrupted`, so its record says `interrupted`.

On SLURM the allocation ends with signals: `scancel` and preemption send SIGTERM, the time limit
sends SIGTERM too, and jobs submitted through submitit (`hydra/launcher=slurm`) get SIGUSR2
`signal_delay_s` seconds before the time limit (`--signal=USR2@<s>`; submitit's own handler would
try to requeue the job and end it as failed). By default Python dies at once without a record.
Inside `catch_termination()` each of these raises `RunInterrupted` in the main thread, the
pipeline records the stage, and the CLI prints one line (or, in a launched job, returns the outcome
to the launching process). SLURM often delivers SIGTERM twice (to srun and to the step): a repeat of
SIGTERM or SIGUSR2 while the record is being written is logged and ignored; SIGINT always raises.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from prunelab.errors import RunInterrupted

log = logging.getLogger(__name__)

SIGNALS = {signal.SIGTERM: "SIGTERM", signal.SIGINT: "SIGINT", signal.SIGUSR2: "SIGUSR2"}
EXIT_CODES = {"SIGTERM": 143, "SIGINT": 130, "SIGUSR2": 140, "SIGUSR1": 138}


def _submitit_signal() -> dict[signal.Signals, str]:
    """submitit's preemption signal when SUBMITIT_PREEMPT_SIGNAL moved it (USR2 by default)."""
    name = "SIG" + os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2").upper().removeprefix("SIG")
    sig = getattr(signal, name, None)
    return {sig: name} if isinstance(sig, signal.Signals) else {}


#: The signal that interrupted the outermost active `catch_termination()` block, if any.
_RAISED: list[str] = []
_DEPTH = [0]


@contextmanager
def catch_termination() -> Iterator[None]:
    """Within the block, SIGTERM, SIGUSR2 (and submitit's preemption signal) and SIGINT raise
    RunInterrupted, once across nested blocks (main thread only; each block restores the handlers
    it found)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    names = {**SIGNALS, **_submitit_signal()}

    def _raise(signum: int, _frame) -> None:
        name = names.get(signum, str(signum))
        if _RAISED and signum != signal.SIGINT:
            log.warning("%s again after %s: finishing the record", name, _RAISED[0])
            return
        _RAISED.append(name)
        raise RunInterrupted(name)

    previous = {sig: signal.signal(sig, _raise) for sig in names}
    _DEPTH[0] += 1
    try:
        yield
    finally:
        _DEPTH[0] -= 1
        if not _DEPTH[0]:
            _RAISED.clear()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def exit_code(err: BaseException) -> int:
    """Shell convention: 128 + signal number."""
    return EXIT_CODES.get(getattr(err, "signal_name", "SIGINT"), 130)
