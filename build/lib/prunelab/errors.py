"""Errors that end a run with one clear line instead of a traceback.

`PrunelabError` and its subclasses carry a message written for the researcher at the terminal; the
CLI prints it alone (exit code 2). Anything else is a bug and keeps its traceback.
"""


class PrunelabError(Exception):
    """An expected failure with a one-line explanation."""


class ConfigError(PrunelabError):
    """The composed configuration is invalid; raised before any model or data is loaded."""


class DataUnavailableError(PrunelabError):
    """A data set cannot be reached (offline, missing file); the message names the alternative."""


class UnsupportedModelError(PrunelabError):
    """The checkpoint's `model_type` has no adapter."""


def check_choice(key: str, value: object, choices: tuple) -> None:
    """A setting that must be one of a few values: a ConfigError naming the key and the options."""
    if value not in choices:
        raise ConfigError(f"{key} must be one of {', '.join(map(str, choices))}, not {value!r}")


class ModelCheckError(PrunelabError):
    """The model cannot be used as configured: unreachable, corrupt, mismatched or too large."""


class StorageError(PrunelabError):
    """A file could not be written (full disk, read-only folder); nothing half-written is kept."""


class RunInterrupted(KeyboardInterrupt):
    """SIGTERM (what SLURM sends before killing a job) or SIGINT ended the run.

    A KeyboardInterrupt, not an Exception, so a sweep's keep-going handler never swallows it.
    """

    def __init__(self, signal_name: str = "SIGINT"):
        super().__init__(signal_name)
        self.signal_name = signal_name
