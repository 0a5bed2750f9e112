#!/usr/bin/env bash
# What a pip user gets: build the wheel, install it in a fresh venv (torch's CPU build first), and
# from an empty folder run `prunelab --help`, a short real run and the README's Python snippet.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
PYTHON=${PYTHON:-python3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$repo/.venv/bin/python" -m pip wheel --quiet --no-deps --wheel-dir "$work/dist" "$repo"
wheel=$(ls "$work"/dist/prunelab-*.whl)
"$repo/.venv/bin/python" -c "import sys, zipfile; names = zipfile.ZipFile(sys.argv[1]).namelist(); \
assert 'prunelab/conf/config.yaml' in names and 'prunelab/conf/model/smollm2_135m.yaml' in names, 'the wheel lacks the packaged configs'; \
assert 'prunelab/gpu_check/shapes/llama2_7b.json' in names, 'the wheel lacks the GPU check\'s shapes'" "$wheel"

"$PYTHON" -m venv "$work/venv"
"$work/venv/bin/python" -m pip install --quiet "torch==2.13.0" 2>&1 | grep -v "^WARNING: Location" || true
"$work/venv/bin/python" -m pip install --quiet "$wheel" 2>&1 | grep -v "^WARNING: Location" || true
"$work/venv/bin/python" -c "import prunelab" || { echo "the wheel did not install"; exit 1; }

mkdir "$work/empty" && cd "$work/empty"
export WANDB_MODE=offline PRUNELAB_CACHE="$work/cache"
"$work/venv/bin/prunelab" --help > help.txt && grep -q "prunelab aggregate" help.txt
"$work/venv/bin/prunelab-gpu-check" --help > gpu_help.txt && grep -q "(f) Wanda and SparseGPT" gpu_help.txt
"$work/venv/bin/prunelab" install-data --dry-run > data.txt && grep -q -- "--no-deps" data.txt
"$work/venv/bin/prunelab" evaluation=ppl runtime.progress=false tracking.dir=. 2>&1 | tail -n 2
test -n "$(ls records/*/seed0/result.json)"
"$work/venv/bin/python" - <<'PY'
import glob, json
record = json.load(open(glob.glob("records/*/seed0/result.json")[0]))
assert record["status"] == "completed", record["status"]
package = record["environment"]["package"]
assert package["install"] == "archive" and package["version"], package
print("wheel run:", record["labels"]["method"], {k: round(m["value"], 4) for k, m in record["metrics"]["pruned"].items()})
PY
# the README's Python snippet, as written there
sed -n '/<!-- readme-snippet -->/,/<!-- \/readme-snippet -->/p' "$repo/README.md" | sed '1,2d;$d' | sed '$d' > snippet.py
test -s snippet.py
"$work/venv/bin/python" snippet.py
echo "wheel check: passed"
