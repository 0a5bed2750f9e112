"""Data: calibration samplers and evaluation corpora, with the references' exact protocols."""

from prunelab.data.spec import CALIBRATION_SOURCES, EVAL_CORPORA, CalibrationSpec, DataSpec
from prunelab.data.tokens import TokenCache, calibration_samples, eval_token_stream, tokenizer_fingerprint

__all__ = [
    "CALIBRATION_SOURCES", "EVAL_CORPORA", "CalibrationSpec", "DataSpec", "TokenCache",
    "calibration_samples", "eval_token_stream", "tokenizer_fingerprint",
]
