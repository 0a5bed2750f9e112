"""Evaluation: perplexity (token and word protocols) and zero-shot accuracy, each stamped."""

from prunelab.evaluation.metrics import Metric
from prunelab.evaluation.perplexity import PerplexityEvaluator, PerplexitySpec
from prunelab.evaluation.spec import EvaluationSpec
from prunelab.evaluation.zeroshot import ZeroShotEvaluator, ZeroShotSpec

__all__ = ["EvaluationSpec", "Metric", "PerplexityEvaluator", "PerplexitySpec", "ZeroShotEvaluator", "ZeroShotSpec"]
