"""prunelab: pruning large language models, evaluated and compared fairly across seeds.

The pipeline is allocate (weight pruning) or score (depth pruning) -> prune -> recover -> evaluate
(see `prunelab.pipeline`); Hydra config groups (`conf/`, shipped as `prunelab/conf/`) select the model, data,
pruning method, recovery, evaluators and tracking.

    import prunelab
    model, tokenizer = prunelab.load("smollm2_135m")   # a model= option, a folder or a hub id
    report = prunelab.prune(model, tokenizer, method="wanda", sparsity=0.5, calibration="realtext")
    metrics = prunelab.evaluate(model, tokenizer, data="realtext")
    record = prunelab.run(["pruning=sparsegpt", "seed=1"])   # what `prunelab pruning=sparsegpt seed=1` runs
"""

from importlib import metadata as _metadata

try:
    __version__ = _metadata.version("prunelab")
except _metadata.PackageNotFoundError:  # run from a source tree that is not installed
    __version__ = "0.0.0+unknown"

__all__ = ["__version__", "evaluate", "load", "prune", "run", "shipped_model"]


def __getattr__(name: str):
    """`prunelab.prune`, `.evaluate` and `.run` import torch and transformers on first use only."""
    if name in ("prune", "evaluate", "load", "run", "shipped_model"):
        from prunelab import api

        return getattr(api, name)
    raise AttributeError(f"module 'prunelab' has no attribute {name!r}")
