"""The metric value every evaluator returns: a number, its protocol stamp and per-sample values."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Metric:
    """One evaluated number with what is needed to compare and pair it.

    `protocol` is the stamp (two metrics are comparable only if their stamps are equal); `samples`
    keeps per-window / per-document / per-item values for paired statistics.
    """

    value: float
    higher_is_better: bool
    protocol: dict[str, Any]
    samples: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
