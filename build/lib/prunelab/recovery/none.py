"""No recovery: the pruned model as it is. Select with `recovery=none` (the default)."""

from __future__ import annotations

from typing import Any

from prunelab.recovery.base import RecoveryContext


class NoRecovery:
    name = "none"

    def recover(self, ctx: RecoveryContext) -> dict[str, Any]:
        return {}
