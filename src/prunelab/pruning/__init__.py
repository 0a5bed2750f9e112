"""Pruning methods, masks and reports. Each method lives in its own module (import it from there,
e.g. `prunelab.pruning.wanda.Wanda`), selected by a YAML in `conf/pruning/`.

Nothing is imported here, so importing one module of the package loads no method it does not use.
`prunelab.pruning.Dense` and `prunelab.pruning.Magnitude` are still resolved, on first access,
because `conf/pruning/dense.yaml` and `magnitude.yaml` name them: a `_target_` string is part of the
config signature, and changing it would rename those settings in every record and committed study
table.
"""

from __future__ import annotations

import importlib
from typing import Any

_CONFIG_TARGETS = {"Dense": "prunelab.pruning.dense", "Magnitude": "prunelab.pruning.magnitude"}


def __getattr__(name: str) -> Any:
    if name in _CONFIG_TARGETS:
        return getattr(importlib.import_module(_CONFIG_TARGETS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
