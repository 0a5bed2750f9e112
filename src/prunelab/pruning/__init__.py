"""Pruning methods, masks and reports. Each method lives in its own module, selected by a YAML in
`conf/pruning/`."""

from prunelab.pruning.base import PruneContext, PruneReport, PruningMethod
from prunelab.pruning.dense import Dense
from prunelab.pruning.magnitude import Magnitude

__all__ = ["Dense", "Magnitude", "PruneContext", "PruneReport", "PruningMethod"]
