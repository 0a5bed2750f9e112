"""Analysis of prunelab runs: read `result.json` records, compare settings across seeds with
paired tests, and write paper tables and plots (CLI: `prunelab-aggregate`).

Modules: `records` (load and flatten records, W&B in and out), `stats` (paired tests, pure
functions on numbers, through scipy and statsmodels), `tables` (summary, baseline comparisons,
md/tex/csv, pivots), `render` (md through tabulate, LaTeX through pandas' Styler), `paper` (the
paper-table preset), `names` (display names of metrics and labels), `plots`, `profiles` and
`style` (matplotlib figures), `outputs` (a study's files), `by_model` (models side by side),
`studies` (the committed results, for the notebook), `cli` (the command line).
"""

from prunelab.analysis.compare import compare_runs
from prunelab.analysis.records import (
                                       AnalysisError,
                                       LoadedRecords,
                                       RunRecord,
                                       load_records,
                                       load_wandb_runs,
                                       log_table_to_wandb,
                                       read_record,
                                       records_to_frame,
)
from prunelab.analysis.stats import PairingError
from prunelab.analysis.tables import build_summary, format_table, pivot

__all__ = [
    "AnalysisError", "LoadedRecords", "PairingError", "RunRecord", "build_summary",
    "compare_runs", "format_table", "load_records", "load_wandb_runs", "log_table_to_wandb",
    "pivot", "read_record", "records_to_frame",
]
