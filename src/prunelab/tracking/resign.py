"""Move records to the signature their config hashes to now: `python -m prunelab.tracking.resign DIR`.

A key the config gains keeps older records' signatures once it is listed as neutral at the value
that computes what they did (record.NEUTRAL_FIELDS). Records written between the key's arrival and
that listing hashed it in: they sit in a folder of their own, apart from the runs they repeat, so
tables see two settings and a relaunch computes them again. Re-signing moves each such seed folder
to `<DIR>/<signature now>/seed<n>/` with its records' `signature` field, after checking all moves
first: nothing is overwritten, and a folder with a lease (a run in progress) stops the whole move.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from prunelab.errors import StorageError
from prunelab.tracking.lease import LEASE_NAME
from prunelab.tracking.record import config_signature, read_record, write_record


def planned_moves(records_dir: str | Path) -> list[tuple[Path, Path]]:
    """(seed folder, where it belongs) for each record whose config hashes to another signature."""
    records_dir = Path(records_dir)
    if not records_dir.is_dir():
        raise StorageError(f"{records_dir} is not a folder of records (<dir>/<signature>/seed<n>/result.json)")
    moves = []
    for path in sorted(records_dir.glob("*/seed*/result.json")):
        record = read_record(path)
        if not record or not isinstance(record.get("config"), dict):
            continue
        signature = config_signature(record["config"])
        if signature != path.parent.parent.name:
            moves.append((path.parent, records_dir / signature / path.parent.name))
    targets = [target for _, target in moves]
    for seed_dir, target in moves:
        if targets.count(target) > 1:
            raise StorageError(f"{target} would receive {targets.count(target)} folders: "
                               "records of one setting and seed lie under several stale signatures")
        if target.exists():
            raise StorageError(f"cannot move {seed_dir} to {target}: a record of that setting and seed is there")
        if (seed_dir / LEASE_NAME).exists():
            raise StorageError(f"{seed_dir} has a lease (a run in progress): re-sign after it ends")
    return moves


def resign(records_dir: str | Path, dry_run: bool = False) -> list[tuple[Path, Path]]:
    """Move every stale seed folder under `records_dir` (see `planned_moves`); returns the moves."""
    moves = planned_moves(records_dir)
    if dry_run:
        return moves
    for seed_dir, target in moves:
        for path in seed_dir.glob("result*.json"):   # result.json and the failed reruns kept beside it
            record = read_record(path)
            if record is not None:
                write_record(path, {**record, "signature": target.parent.name})
        target.parent.mkdir(parents=True, exist_ok=True)
        seed_dir.rename(target)
        if not any(seed_dir.parent.iterdir()):
            seed_dir.parent.rmdir()
    return moves


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m prunelab.tracking.resign", description=__doc__.splitlines()[0])
    parser.add_argument("records_dir", nargs="+", help="records folders (<dir>/<signature>/seed<n>/result.json)")
    parser.add_argument("--dry-run", action="store_true", help="list the moves, move nothing")
    args = parser.parse_args(argv)
    try:
        for records_dir in args.records_dir:
            for seed_dir, target in resign(records_dir, dry_run=args.dry_run):
                print(f"{'would move' if args.dry_run else 'moved'} {seed_dir} -> {target}")
    except StorageError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
