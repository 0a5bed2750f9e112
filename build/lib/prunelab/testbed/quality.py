"""Quality of a testbed model, measured with the project's own pipeline components.

  * test perplexity: the `data=testbed` token protocol (`PerplexityEvaluator`: test documents
    joined with "\\n\\n", non-overlapping ``WINDOW``-token windows);
  * unstructured magnitude pruning at 50% / 70%: the `pruning=magnitude` method (one threshold per
    matrix over the decoder-block linears; never embeddings or lm_head), then perplexity and tasks;
  * single decoder-layer removal: perplexity with each layer dropped in turn
    (`ModelAdapter.layers_replaced`);
  * zero-shot accuracy on ``tasks.TASKS`` through lm-eval (`ZeroShotEvaluator`, metric ``acc``).

Run ``python -m prunelab.testbed.quality <model_dir>`` to print a JSON report.
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import math
import time

import torch
from torch import nn

from prunelab.evaluation.perplexity import PerplexityEvaluator, PerplexitySpec, window_nlls
from prunelab.evaluation.zeroshot import ZeroShotSpec
from prunelab.models.adapter import ModelAdapter
from prunelab.testbed import corpus, tasks

logger = logging.getLogger(__name__)

WINDOW = 256
TEST_DOCUMENTS = 400
TASK_ITEMS = 500  # every held-out item, as `evaluation=default` runs them: cards and records agree


def test_windows(tokenizer, n_documents: int = TEST_DOCUMENTS, window: int = WINDOW,
                 split: str = "test") -> torch.Tensor:
    """Token windows [num_windows, window] over ``split`` documents joined with blank lines."""
    text = "\n\n".join(corpus.documents(split, n_documents))
    ids = tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"]
    usable = len(ids) // window * window
    return torch.tensor(ids[:usable], dtype=torch.long).view(-1, window)


def perplexity(model: nn.Module, windows: torch.Tensor, batch_size: int = 16) -> float:
    """exp(mean window NLL) over ``windows`` [num_windows, window] (the token protocol)."""
    model.eval()
    nlls = window_nlls(model, windows.reshape(1, -1), windows.shape[1], batch_size, progress=False)
    return math.exp(sum(nlls) / len(nlls))


def test_perplexity(model: nn.Module, tokenizer) -> float:
    """The `data=testbed` token perplexity, as every run records it."""
    evaluator = PerplexityEvaluator(PerplexitySpec(seqlen=WINDOW, batch_size=16), ("testbed",), progress=False)
    return evaluator.evaluate(model, tokenizer)["ppl/testbed/token"].value


def magnitude_pruned(model: nn.Module, sparsity: float) -> nn.Module:
    """Copy of ``model`` pruned by the `pruning=magnitude` method (per-matrix threshold)."""
    from prunelab.context import PruneContext
    from prunelab.pruning.magnitude import Magnitude

    pruned = copy.deepcopy(model)
    loaded = type("Loaded", (), {"adapter": ModelAdapter(pruned), "model": pruned})()
    method = Magnitude(sparsity=sparsity)
    ctx = PruneContext(loaded, seed=0, calibration=lambda: None, progress=False)
    method.prune(ctx, method.allocate(ctx))
    return pruned


def all_task_accuracies(model: nn.Module, tokenizer, n: int = TASK_ITEMS) -> dict[str, float]:
    """lm-eval accuracy (``acc``) on every testbed task, through the project's zero-shot evaluator."""
    spec = ZeroShotSpec(tasks=tasks.TASKS, items=n, batch_size=64)
    metrics = spec.build(progress=False).evaluate(model, tokenizer)
    return {name: metrics[f"zeroshot/{name}/acc"].value for name in tasks.TASKS}


def evaluate(model: nn.Module, tokenizer, *, layer_removal: bool = True, pruning: bool = True,
             n_documents: int = TEST_DOCUMENTS, n_items: int = TASK_ITEMS) -> dict:
    """Full quality report (dense, pruned and layer-removed) as a JSON-able dict."""
    started = time.time()
    report: dict = {"window": WINDOW, "protocol": "data=testbed token perplexity (PerplexityEvaluator)"}
    report["test_ppl"] = test_perplexity(model, tokenizer)
    validation = test_windows(tokenizer, n_documents, split="validation")
    report["validation_ppl"] = perplexity(model, validation)
    report["unigram_ppl"] = corpus.unigram_perplexity(tokenizer)
    report["tasks"] = all_task_accuracies(model, tokenizer, n_items)
    logger.info("dense: test ppl %.3f, tasks %s", report["test_ppl"], report["tasks"])
    if pruning:
        for sparsity in (0.5, 0.7):
            pruned = magnitude_pruned(model, sparsity)
            ppl = test_perplexity(pruned, tokenizer)
            report[f"magnitude_{int(sparsity * 100)}"] = {
                "ppl": ppl,
                "ppl_increase": ppl / report["test_ppl"] - 1,
                "tasks": all_task_accuracies(pruned, tokenizer, n_items),
            }
            logger.info("magnitude %.0f%%: ppl %.3f (+%.1f%%)", sparsity * 100, ppl,
                        100 * (ppl / report["test_ppl"] - 1))
    if layer_removal:
        increases = []
        adapter = ModelAdapter(model)
        layers = list(adapter.layers)
        for index in range(len(layers)):
            with adapter.layers_replaced([layer for i, layer in enumerate(layers) if i != index]):
                increases.append(test_perplexity(model, tokenizer) / report["test_ppl"] - 1)
        report["layer_removal_ppl_increase"] = increases
        logger.info("layer removal: %s", ", ".join(f"{100 * x:.1f}%" for x in increases))
    report["eval_seconds"] = time.time() - started
    return report


def main() -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir")
    parser.add_argument("--documents", type=int, default=TEST_DOCUMENTS)
    parser.add_argument("--items", type=int, default=TASK_ITEMS)
    parser.add_argument("--threads", type=int, default=0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    if args.threads:
        torch.set_num_threads(args.threads)
    model = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
    report = evaluate(model, tokenizer, n_documents=args.documents, n_items=args.items)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
