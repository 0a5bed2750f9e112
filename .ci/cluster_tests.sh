#!/usr/bin/env bash
# The cluster part of CI: start a single-node SLURM cluster on this machine (.ci/slurm_cluster.sh,
# as root), run the cluster tests against it (pytest -m cluster: real sweeps through
# hydra/launcher=slurm_cpu), and stop every daemon it started, by PID, whatever the outcome.
#   bash .ci/cluster_tests.sh            # PY=/path/to/python to use another interpreter than .venv's
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}

trap 'bash .ci/slurm_cluster.sh stop' EXIT
trap 'exit 130' INT TERM
began=$SECONDS
bash .ci/slurm_cluster.sh start
eval "$(bash .ci/slurm_cluster.sh env)"
"$PY" -m pytest -q -m cluster -o log_cli=true --log-cli-level=INFO --durations=0 tests/test_cluster.py tests/test_cluster_preempt.py
echo "cluster tests: $((SECONDS - began)) s with the cluster's start" >&2
