"""Training-free recovery after pruning: operators fitted on calibration data, attached or merged."""

from prunelab.recovery.base import Recovery, RecoveryContext
from prunelab.recovery.none import NoRecovery

__all__ = ["NoRecovery", "Recovery", "RecoveryContext"]
