"""Test oracles: independent, plain-loop re-implementations of the pruning references.

What they are for: prunelab's `pruning=magnitude`, `pruning=wanda` and `pruning=sparsegpt` claim to
reproduce their official references bit for bit. These oracles are written from the published
protocols only, as readable loops over a Hugging Face Llama model (`model.model.layers`), with their
own layer-0 catcher, hooks, statistics and mask code, so that prunelab and an implementation that
shares none of its code can be compared mask entry by mask entry:

- `magnitude_oracle`: |W|, one threshold per matrix (the Wanda repository's magnitude baseline,
  Sun et al. 2023, after Han et al. 2015);
- `wanda_oracle`: |W| * ||X_j||_2, exactly k per output row (Sun, Liu, Bair & Kolter, "A Simple
  and Effective Pruning Approach for Large Language Models", 2023);
- `sparsegpt_oracle`: the OBS solver with the adaptive 128-column mask (Frantar & Alistarh,
  "SparseGPT: Massive Language Models Can Be Accurately Pruned in One-Shot", 2023);
- `ria_oracle`: relative importance times activation ** a, one threshold per matrix, and the
  heuristic channel reallocation for N:M (Zhang et al., "Plug-and-Play", ICLR 2024);
- `oracles.flap`: FLAP's fluctuation metric, adaptive structure and bias, and its Wanda-sp and
  magnitude-sp baselines, cutting heads and channels out of a multi-head Llama (An et al.,
  "Fluctuation-based Adaptive Structured Pruning for Large Language Models", AAAI 2024);
- `dsnot_oracle`: DSnoT's prune-and-grow refinement of the Wanda mask, row by row (Zhang et al.,
  "Dynamic Sparse No Training", ICLR 2024).
- `oracles.llm_pruner`: LLM-Pruner's block-wise Taylor (and l1/l2) importance of heads with their
  key/value group and of MLP channels, cut out of a Llama (Ma, Fang & Wang, "LLM-Pruner: On the
  Structural Pruning of Large Language Models", NeurIPS 2023).
- `oracles.slicegpt`: SliceGPT's norm fusion, PCA of every residual point, rotation and deletion of
  the smallest principal directions with the shortcut matrices (Ashkboos et al., "SliceGPT: Compress
  Large Language Models by Deleting Rows and Columns", ICLR 2024).

Nothing in these modules imports prunelab (`tests/test_faithful_references.py` checks it); they
know Llama's attribute paths and nothing else, so they serve Llama-family models (SmolLM2) only.
The comparison with prunelab lives apart, in `oracles.compare`, which is the one module that
imports prunelab.
"""

from oracles.dsnot import dsnot_oracle
from oracles.llama_layers import capture_layer0_inputs, decoder_linears, run_layer
from oracles.magnitude import magnitude_oracle
from oracles.ria import ria_oracle
from oracles.sparsegpt import sparsegpt_oracle
from oracles.wanda import wanda_oracle

ORACLES = {"magnitude": magnitude_oracle, "wanda": wanda_oracle, "sparsegpt": sparsegpt_oracle,
           "ria": ria_oracle, "dsnot": dsnot_oracle}

__all__ = ["ORACLES", "capture_layer0_inputs", "decoder_linears", "dsnot_oracle", "magnitude_oracle", "run_layer",
           "ria_oracle", "sparsegpt_oracle", "wanda_oracle"]
