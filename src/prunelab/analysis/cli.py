"""`prunelab-aggregate`: records -> results tables (md, tex, csv), the paper table and plots for
one study.

    prunelab-aggregate records/ --out results/pals --metric ppl/wikitext2/token \\
        --baseline allocation=uniform --pivot method,sparsity --plot-x sparsity
    prunelab-aggregate --from-table results/pals/table.csv --out results/pals --pivot ...
    prunelab-aggregate --compare records/<sigA>/seed0 records/<sigB>/seed0

`--from-table` re-renders a committed table.csv (md, tex, pivots, paper table, metric plots)
when the records are not at hand; table.csv itself is then left as it is.

Exit codes: 0 done, 2 for a user error (no records, unknown metric/baseline/label), printed as
one line on stderr.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Sequence

import pandas as pd

from prunelab.analysis import compare, costs, interaction, outputs, plots, tables
from prunelab.analysis.records import (
    AnalysisError,
    LoadedRecords,
    find_record_files,
    load_records,
    load_wandb_runs,
    log_table_to_wandb,
    read_record,
    records_to_frame,
)
from prunelab.analysis.stats import DEFAULT_N_RESAMPLES, DEFAULT_SEED

PROG = "prunelab-aggregate"
log = logging.getLogger("prunelab.analysis")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description="Aggregate prunelab run records into tables, tests and plots.")
    parser.add_argument("dirs", nargs="*", metavar="DIR",
                        help="folders searched recursively for result.json")
    parser.add_argument("--out", help="output folder (default: results/<study>)")
    parser.add_argument("--metric", action="append", default=[],
                        help="metric key or pattern, repeatable or comma-separated "
                             "(default: all)")
    parser.add_argument("--optional-metric", action="append", default=[], metavar="METRIC",
                        help="like --metric, but left out where the records do not carry it (a "
                             "study's speed-ups or zero-shot average that some backbones skip)")
    parser.add_argument("--baseline",
                        help="baseline setting: label filters like allocation=uniform[,method=x]"
                             " or a 16-hex signature")
    parser.add_argument("--match-on",
                        help="labels a setting shares with its baseline (default: model,sparsity,"
                             "sparsity_type,layers_removed)")
    parser.add_argument("--group-by",
                        help="columns defining a setting, e.g. labels.method,labels.sparsity "
                             "(default: signature)")
    parser.add_argument("--pivot", action="append", default=[],
                        help="ROW[,ROW...],COLUMN labels for a method x sparsity grid")
    parser.add_argument("--paper",
                        help="ROW[,ROW...],COLUMN labels of the paper table (paper_table.md/.tex;"
                             " default: the first --pivot, else sparsity or depth as columns)")
    parser.add_argument("--from-table", metavar="CSV",
                        help="re-render a table.csv written by this tool instead of reading "
                             "records (table.csv is not rewritten; no layer profiles)")
    parser.add_argument("--where", action="append", default=[], metavar="LABEL=GLOB",
                        help="only the records whose label matches (model=gemma3*: one backbone of a "
                             "study's shared records folder); repeatable")
    parser.add_argument("--interaction", metavar="LABEL",
                        help="test whether each setting's paired difference from --baseline depends on this "
                             "label (model: a cross-backbone claim); writes interaction.md/.csv and a figure")
    parser.add_argument("--vs-dense", action="store_true",
                        help="also show each setting's change over dense in %% (tables and pivots)")
    parser.add_argument("--format", default="md,tex,csv", help="comma-separated: md,tex,csv")
    parser.add_argument("--plot-x", help="numeric label for metric plots (default: sparsity or "
                                         "layers_removed, if they vary)")
    parser.add_argument("--error", choices=plots.ERROR_BARS, default="std",
                        help="error bars over seeds (default: std)")
    parser.add_argument("--no-plots", action="store_true", help="write tables only")
    parser.add_argument("--decimals", type=int, help="decimals in md/tex cells (default: auto)")
    parser.add_argument("--n-resamples", type=int, default=DEFAULT_N_RESAMPLES,
                        help="bootstrap resamples")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED, help="bootstrap random seed")
    parser.add_argument("--wandb-project", help="also load runs from this W&B project")
    parser.add_argument("--wandb-entity", help="W&B entity of --wandb-project")
    parser.add_argument("--wandb-log", metavar="PROJECT",
                        help="also log the summary table to a new W&B run in PROJECT "
                             "(online with credentials, else offline)")
    parser.add_argument("--compare", nargs=2, metavar=("RUN_A", "RUN_B"),
                        help="per-item tests between two single runs (result.json or run folder)")
    parser.add_argument("-v", "--verbose", action="store_true", help="more log output")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `prunelab-aggregate`; returns the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:
        return int(exit_.code or 0)
    _setup_logging(args.verbose)
    try:
        if args.compare:
            return _compare(args)
        return _aggregate(args)
    except AnalysisError as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return 2


# --------------------------------------------------------------------------- aggregate


def _aggregate(args: argparse.Namespace) -> int:
    if args.from_table:
        summary, loaded = _read_table(args.from_table), None
        ignored = [name for name in ("baseline", "match_on", "group_by", "dirs")
                   if getattr(args, name)]
        if ignored:
            log.info("--from-table: the table's own comparisons are kept; ignored %s",
                     ", ".join(ignored))
        frame = summary
        metrics = tables.select_metrics(summary, _split_all(args.metric), _split_all(args.optional_metric))
        summary = summary[summary["metric"].isin(metrics)].reset_index(drop=True)
    else:
        loaded = _load(args)
        if not loaded.completed:
            where = ", ".join(args.dirs) or f"W&B project {args.wandb_project}"
            raise AnalysisError(f"no completed records found in {where} ({loaded.describe()})")
        print(f"{PROG}: {loaded.describe()}", file=sys.stderr)
        frame = records_to_frame(loaded)
        metrics = tables.select_metrics(frame, _split_all(args.metric), _split_all(args.optional_metric))
        summary = tables.build_summary(
            frame, metrics, group_by=_split(args.group_by), baseline=args.baseline,
            match_on=_split(args.match_on) if args.match_on is not None else None,
            n_resamples=args.n_resamples, seed=args.seed)
    out = Path(args.out) if args.out else _default_out(frame)
    formats = _split(args.format)
    unknown = sorted(set(formats) - {"md", "tex", "csv"})
    if unknown:
        raise AnalysisError(f"unknown --format {', '.join(unknown)}; use md, tex, csv")
    table_formats = [f for f in formats if not (args.from_table and f == "csv")]
    written = list(tables.write_outputs(summary, out, table_formats, decimals=args.decimals,
                                        vs_dense=args.vs_dense).values())
    table, notes = tables.format_table(summary, args.decimals, vs_dense=args.vs_dense)
    print(tables.to_markdown(table, notes))
    for spec in args.pivot:
        written += outputs.write_pivots(summary, metrics, spec, out, formats, args.decimals,
                                        args.vs_dense)
    written += outputs.write_paper(summary, metrics, args.paper or next(iter(args.pivot), None),
                                   out, formats, args.decimals)
    if args.interaction:
        if not args.baseline or args.from_table:
            raise AnalysisError("--interaction needs the records and a --baseline (allocation=uniform)")
        table_ = interaction.interaction_table(frame, metrics, args.baseline, args.interaction,
                                               _split(args.match_on) if args.match_on is not None else None)
        written += interaction.write_interaction(table_, out, args.interaction, args.baseline,
                                                  plots=not args.no_plots)
    if loaded:  # what each setting cost to prune and to run (records with a pruning_cost)
        written += costs.write_cost_tables(loaded.completed, out, formats)
    if not args.no_plots:
        x = outputs.plot_x(summary, args.plot_x)
        written += outputs.write_plots(summary, loaded.completed if loaded else None, metrics, x,
                                       args.error, out)
    print(f"{PROG}: wrote {', '.join(str(p) for p in written)}", file=sys.stderr)
    if args.wandb_log:
        _log_to_wandb(summary, args.wandb_log, out)
    return 0


def _read_table(path: str) -> pd.DataFrame:
    if not Path(path).is_file():
        raise AnalysisError(f"no such table: {path}")
    summary = tables.read_summary_csv(path)
    needed = {"setting", "metric", "mean", "std", "n", "is_dense"}
    if not needed <= set(summary.columns):
        raise AnalysisError(f"{path} is not a table.csv written by {PROG} "
                            f"(no {', '.join(sorted(needed - set(summary.columns)))})")
    return summary


def _log_to_wandb(summary: pd.DataFrame, project: str, out: Path) -> None:
    """The aggregate table as a W&B table, in a run of its own (job_type aggregate)."""
    from prunelab.tracking import WandbTracker
    from prunelab.tracking.naming import RunNames

    tracker = WandbTracker(project=project, dir=str(out))
    names = RunNames(name=f"aggregate-{out.name}", group="aggregate", job_type="aggregate", tags=())
    tracker.start(names, config={"out": str(out)})
    if tracker.run is not None:
        log_table_to_wandb(summary, run=tracker.run)
    tracker.finish("completed")


def _load(args: argparse.Namespace) -> LoadedRecords:
    if not args.dirs and not args.wandb_project:
        raise AnalysisError("give at least one DIR (or --wandb-project)")
    loaded = load_records(args.dirs) if args.dirs else LoadedRecords()
    if args.wandb_project:
        loaded.extend(load_wandb_runs(args.wandb_project, args.wandb_entity))
    if args.where:
        filters = dict(part.split("=", 1) for part in args.where if "=" in part)
        if len(filters) != len(args.where):
            raise AnalysisError(f"bad --where {args.where}: use LABEL=GLOB, e.g. model=gemma3*")
        loaded = loaded.where(filters)
    return loaded


def _default_out(frame: pd.DataFrame) -> Path:
    studies = frame["study"].dropna().unique() if "study" in frame else []
    return Path("results") / (str(studies[0]) if len(studies) == 1 else "aggregate")


# --------------------------------------------------------------------------- compare


def _compare(args: argparse.Namespace) -> int:
    record_a, record_b = (_read_run(run) for run in args.compare)
    for run, record in zip(args.compare, (record_a, record_b)):
        if record.status != "completed":
            raise AnalysisError(f"{run} is a {record.status} run; nothing to compare")
    result = compare.compare_runs(record_a, record_b, _split_all(args.metric) or None,
                                 n_resamples=args.n_resamples, seed=args.seed)
    if result.empty:
        raise AnalysisError("the two runs share no metric")
    print(f"A = {record_a.name} ({record_a.source})\nB = {record_b.name} ({record_b.source})\n")
    text = tables.to_markdown(_compare_for_display(result))
    print(text)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "compare.md").write_text(text, encoding="utf-8")
        result.to_csv(out / "compare.csv", index=False)
    return 0


def _read_run(run: str):
    try:
        return read_record(_record_path(run))
    except AnalysisError as error:
        raise AnalysisError(f"{run}: {error}") from None


def _record_path(run: str) -> Path:
    path = Path(run)
    if path.is_file():
        return path
    found = find_record_files([path]) if path.is_dir() else []
    if len(found) != 1:
        raise AnalysisError(f"expected one result.json, found {len(found)}")
    return found[0]


def _compare_for_display(result: pd.DataFrame) -> pd.DataFrame:
    shown = result.copy()
    for column in ("value_a", "value_b", "difference", "ci_low", "ci_high"):
        shown[column] = shown[column].map(lambda v: "" if pd.isna(v) else f"{float(v):.4g}")
    for column in ("p", "p_chi2"):
        shown[column] = shown[column].map(lambda v: "" if pd.isna(v) else f"{float(v):.3g}")
    for column in ("n_units", "a_only", "b_only"):
        shown[column] = shown[column].map(lambda v: "" if pd.isna(v) else str(int(v)))
    return shown.fillna("")


# --------------------------------------------------------------------------- helpers


def _split(text: str | None) -> list[str]:
    return [part.strip() for part in (text or "").split(",") if part.strip()]


def _split_all(values: Sequence[str]) -> list[str]:
    return [part for value in values for part in _split(value)]


class _StderrHandler(logging.Handler):
    """Writes to whatever sys.stderr is at the time (so captured streams in tests work)."""

    def emit(self, record: logging.LogRecord) -> None:
        print(self.format(record), file=sys.stderr)


_handler = _StderrHandler()
_handler.setFormatter(logging.Formatter(f"{PROG}: %(levelname)s: %(message)s"))


def _setup_logging(verbose: bool) -> None:
    if _handler not in log.handlers:
        log.addHandler(_handler)
    log.setLevel(logging.INFO if verbose else logging.WARNING)


if __name__ == "__main__":
    raise SystemExit(main())
