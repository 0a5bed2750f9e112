"""prunelab: pruning large language models, evaluated and compared fairly across seeds.

The pipeline is allocate (weight pruning) or score (depth pruning) -> prune -> recover -> evaluate
(see `prunelab.pipeline`); Hydra config groups under `conf/` select the model, data, pruning
method, recovery, evaluators and tracking.
"""

__version__ = "0.1.0"
