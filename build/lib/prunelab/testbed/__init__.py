"""Testbed: small models trained offline on a synthetic language, shipped with prunelab.

Nothing can be downloaded, yet pruning methods need models whose pruning behaviour resembles a
real LLM's. Modules:
  * ``corpus``      deterministic English-like language over a fixed world of people and facts
  * ``tokenizer``   byte-level BPE trained on that language (``checkpoints/tokenizer/``)
  * ``tasks``       zero-shot two-choice tasks (skills on fresh compositions, memorised facts)
  * ``train``       CPU training from ``recipes/*.yaml``; saves standard Hugging Face directories
  * ``quality``     perplexity, magnitude-pruning and layer-removal sensitivity, task accuracy
  * ``model_card``  README.md model cards whose numbers are computed by ``quality``

Shipped models: ``checkpoints/testbed_llama/`` (``LlamaForCausalLM``) and
``checkpoints/testbed_pythia/step<N>/`` (``GPTNeoXForCausalLM`` checkpoint series).
"""

from pathlib import Path

CHECKPOINT_DIR = Path(__file__).resolve().parent / "checkpoints"
