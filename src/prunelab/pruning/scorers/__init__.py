"""Layer scorers for depth pruning, one module per paper; selected by `conf/pruning/scorer/*.yaml`."""

from prunelab.pruning.scorers.base import LayerScorer, LayerScores, ScoreRequest

__all__ = ["LayerScorer", "LayerScores", "ScoreRequest"]
