"""prunelab's Hydra configs (`conf/` in the repository, `prunelab/conf/` in the wheel).

Each folder is a config group (model, data, pruning, recovery, evaluation, tracking, experiment,
sweep, hydra/launcher); this file only makes the folder the package `prunelab.conf`, so the
configs are package data found the same way in a checkout, an editable install and a wheel.
"""
