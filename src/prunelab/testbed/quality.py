"""Quick quality checks for testbed models: is the model good, and does it prune like an LLM?

Measures, with self-contained code (no lm-eval, so it is fast and has no moving parts):
  * test perplexity: non-overlapping ``WINDOW``-token windows over test documents joined with
    "\\n\\n" (the same framing as training);
  * unstructured magnitude pruning at 50% / 70%: per weight matrix, every ``nn.Linear`` inside
    the decoder blocks (never embeddings or lm_head), then perplexity and task accuracy;
  * single decoder-layer removal: perplexity with each layer dropped in turn;
  * zero-shot accuracy on ``tasks.TASKS`` with a direct log-likelihood scorer
    (sum of log-probabilities of the choice tokens given the context, as lm-eval's ``acc``).

Run ``python -m prunelab.testbed.quality <model_dir>`` to print a JSON report.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import logging
import math
import time

import torch
from torch import nn

from prunelab.testbed import corpus, tasks

logger = logging.getLogger(__name__)

WINDOW = 256
TEST_DOCUMENTS = 400
TASK_ITEMS = 300


def test_windows(tokenizer, n_documents: int = TEST_DOCUMENTS, window: int = WINDOW,
                 split: str = "test") -> torch.Tensor:
    """Token windows [num_windows, window] over ``split`` documents joined with blank lines."""
    text = "\n\n".join(corpus.documents(split, n_documents))
    ids = tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"]
    usable = len(ids) // window * window
    return torch.tensor(ids[:usable], dtype=torch.long).view(-1, window)


@torch.no_grad()
def perplexity(model: nn.Module, windows: torch.Tensor, batch_size: int = 16) -> float:
    """exp(mean next-token loss) over all predicted positions of ``windows``."""
    model.eval()
    total_loss, total_tokens = 0.0, 0
    for start in range(0, len(windows), batch_size):
        batch = windows[start:start + batch_size]
        logits = model(input_ids=batch, use_cache=False).logits[:, :-1].float()
        loss = nn.functional.cross_entropy(
            logits.reshape(-1, logits.size(-1)), batch[:, 1:].reshape(-1), reduction="sum")
        total_loss += loss.item()
        total_tokens += batch[:, 1:].numel()
    return math.exp(total_loss / total_tokens)


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The decoder blocks of a Llama / GPT-NeoX style causal LM."""
    return model.base_model.layers


def magnitude_pruned(model: nn.Module, sparsity: float) -> nn.Module:
    """Copy of ``model`` with the smallest-|w| fraction of each block ``nn.Linear`` zeroed."""
    pruned = copy.deepcopy(model)
    with torch.no_grad():
        for module in decoder_layers(pruned).modules():
            if isinstance(module, nn.Linear):
                weight = module.weight
                k = int(weight.numel() * sparsity)
                if k == 0:
                    continue
                threshold = weight.abs().flatten().kthvalue(k).values
                weight.mul_((weight.abs() > threshold).to(weight.dtype))
    return pruned


@contextlib.contextmanager
def without_layer(model: nn.Module, index: int):
    """Temporarily drop decoder layer ``index`` (the residual stream skips it)."""
    base = model.base_model
    original = base.layers
    base.layers = nn.ModuleList([layer for i, layer in enumerate(original) if i != index])
    try:
        yield model
    finally:
        base.layers = original


@torch.no_grad()
def task_accuracy(model: nn.Module, tokenizer, name: str, n: int = TASK_ITEMS,
                  batch_size: int = 32) -> float:
    """Fraction of items whose gold choice has the highest summed log-likelihood."""
    model.eval()
    items = tasks.task_items(name, n)
    sequences, spans = [], []
    for item in items:
        context = tokenizer(item["context"], add_special_tokens=False)["input_ids"]
        for choice in item["choices"]:
            continuation = tokenizer(choice, add_special_tokens=False)["input_ids"]
            sequences.append(context + continuation)
            spans.append((len(context), len(context) + len(continuation)))
    scores = [0.0] * len(sequences)
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))  # little padding
    for start in range(0, len(order), batch_size):
        chunk = order[start:start + batch_size]
        width = max(len(sequences[i]) for i in chunk)
        batch = torch.zeros(len(chunk), width, dtype=torch.long)
        for row, index in enumerate(chunk):
            batch[row, :len(sequences[index])] = torch.tensor(sequences[index])
        log_probs = model(input_ids=batch, use_cache=False).logits.float().log_softmax(-1)
        for row, index in enumerate(chunk):
            begin, end = spans[index]
            positions = torch.arange(begin - 1, end - 1)
            scores[index] = log_probs[row, positions, batch[row, begin:end]].sum().item()
    correct, cursor = 0, 0
    for item in items:
        item_scores = scores[cursor:cursor + len(item["choices"])]
        cursor += len(item["choices"])
        correct += int(max(range(len(item_scores)), key=item_scores.__getitem__) == item["gold"])
    return correct / len(items)


def all_task_accuracies(model: nn.Module, tokenizer, n: int = TASK_ITEMS) -> dict[str, float]:
    return {name: task_accuracy(model, tokenizer, name, n) for name in tasks.TASKS}


def evaluate(model: nn.Module, tokenizer, *, layer_removal: bool = True, pruning: bool = True,
             n_documents: int = TEST_DOCUMENTS, n_items: int = TASK_ITEMS) -> dict:
    """Full quality report (dense, pruned and layer-removed) as a JSON-able dict."""
    started = time.time()
    windows = test_windows(tokenizer, n_documents)
    report: dict = {"test_windows": len(windows), "window": windows.size(1)}
    report["test_ppl"] = perplexity(model, windows)
    validation = test_windows(tokenizer, n_documents, split="validation")
    report["validation_ppl"] = perplexity(model, validation)
    report["unigram_ppl"] = corpus.unigram_perplexity(tokenizer)
    report["tasks"] = all_task_accuracies(model, tokenizer, n_items)
    logger.info("dense: test ppl %.3f, tasks %s", report["test_ppl"], report["tasks"])
    if pruning:
        for sparsity in (0.5, 0.7):
            pruned = magnitude_pruned(model, sparsity)
            ppl = perplexity(pruned, windows)
            report[f"magnitude_{int(sparsity * 100)}"] = {
                "ppl": ppl,
                "ppl_increase": ppl / report["test_ppl"] - 1,
                "tasks": all_task_accuracies(pruned, tokenizer, n_items),
            }
            logger.info("magnitude %.0f%%: ppl %.3f (+%.1f%%)", sparsity * 100, ppl,
                        100 * (ppl / report["test_ppl"] - 1))
    if layer_removal:
        increases = []
        for index in range(len(decoder_layers(model))):
            with without_layer(model, index):
                increases.append(perplexity(model, windows) / report["test_ppl"] - 1)
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
