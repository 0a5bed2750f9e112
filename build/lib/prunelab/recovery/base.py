"""The recovery contract: fit on calibration data after pruning, modify the model in place."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from prunelab.context import PruneContext, PruneReport


@dataclass
class RecoveryContext:
    prune: PruneContext
    report: PruneReport


class Recovery(Protocol):
    name: str

    def recover(self, ctx: RecoveryContext) -> dict[str, Any]:
        """Fit and apply; returns details for the record."""
