"""Perplexity under the two protocols papers use, each stamped so numbers are never mixed.

- token: the standard (SparseGPT, Wanda, OWL): the test split joined and tokenized once, cut into
  non-overlapping `seqlen` windows (remainder dropped); per window the mean NLL of its seqlen - 1
  predicted tokens, times seqlen; ppl = exp(sum / (windows x seqlen)).
- word: lm-eval's `wikitext` task: one rolling loglikelihood per document over windows of
  `seqlen` tokens (lm-eval's own window functions), word_ppl = exp(total NLL / total words).

Per-window (token) or per-document (word) NLLs are kept for paired statistics.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from prunelab.calibration.passes import batch_logits
from prunelab.calibration.runner import LayerInputs, LayerSequentialRunner, capture_layer_inputs
from prunelab.data import sources
from prunelab.data.tokens import TokenCache, eval_token_stream, tensor_sha256, tokenizer_fingerprint
from prunelab.errors import ConfigError, DataUnavailableError
from prunelab.evaluation.metrics import Metric
from prunelab.models.adapter import ModelAdapter, input_device
from prunelab.models.streaming import store_of

log = logging.getLogger(__name__)

PROTOCOLS = ("token", "word")
WINDOW_ORDERS = ("first", "spread")
#: How a window's NLL is computed (stamped: records before it used a float32 mean over a strided
#: vocabulary dimension, whose numbers differ in the 5th digit, and must not be paired with these).
NLL_ARITHMETIC = "last-dim-fp64"


@dataclass(frozen=True)
class PerplexitySpec:
    """Attributes:
    protocols: token and/or word.
    seqlen: evaluation window; capped at the model's max_position_embeddings (the stamp says so).
    batch_size: windows per forward pass.
    max_windows: evaluate only N windows / documents (quick runs); null = all.
    window_order: with max_windows, which N token windows: `first` (the reference protocols) or
        `spread` (evenly spaced over the whole split, so a short evaluation still samples every
        document; recorded in the protocol stamp).
    """

    protocols: tuple[str, ...] = ("token",)
    seqlen: int = 2048
    batch_size: int = 1
    max_windows: int | None = None
    window_order: str = "first"

    def __post_init__(self) -> None:
        object.__setattr__(self, "protocols", tuple(self.protocols))
        if self.window_order not in WINDOW_ORDERS:
            raise ConfigError(f"evaluation.perplexity.window_order={self.window_order!r}: use first or spread")
        bad = [p for p in self.protocols if p not in PROTOCOLS]
        if bad:
            raise ConfigError(f"evaluation.perplexity.protocols: unknown {bad}; known: token, word")
        if self.seqlen < 2 or self.batch_size < 1:
            raise ConfigError("evaluation.perplexity needs seqlen >= 2 and batch_size >= 1")
        if self.max_windows is not None and self.max_windows < 1:
            raise ConfigError(f"evaluation.perplexity.max_windows={self.max_windows}: use null (all) "
                              "or a number >= 1")


def effective_seqlen(model, seqlen: int) -> int:
    limit = getattr(model.config, "max_position_embeddings", None)
    if limit and seqlen > limit:
        log.info("evaluation seqlen %d capped at the model's max_position_embeddings %d", seqlen, limit)
        return int(limit)
    return seqlen


#: Positions per cross-entropy call: its log-softmax buffer is [LOSS_CHUNK, vocab], not a window's.
LOSS_CHUNK = 128


def summed_nll(logits: torch.Tensor, targets: torch.Tensor, chunk: int = LOSS_CHUNK) -> float:
    """Sum over positions of -log p(target), accumulated in float64.

    The loss is taken over the vocabulary as the last, contiguous dimension, a chunk of positions
    at a time (a strided vocabulary dimension, as in `cross_entropy(logits.transpose(1, 2))`, is
    several times slower and less accurate).

    Args:
        logits: [T, V] next-token logits (position t predicts targets[t]), any float dtype.
        targets: [T] token ids.
    """
    total = 0.0  # a Python float: float64
    for start in range(0, logits.shape[0], chunk):
        part = logits[start : start + chunk].float()  # [c, V]
        nll = F.cross_entropy(part, targets[start : start + chunk], reduction="none")  # [c]
        total += float(nll.double().sum())
    return total


@torch.no_grad()
def window_nlls(model, ids: torch.Tensor, seqlen: int, batch_size: int = 1,
                max_windows: int | None = None, progress: bool = True,
                window_order: str = "first") -> list[float]:
    """Mean NLL of each non-overlapping window of `ids` ([1, L]); the remainder is dropped."""
    windows = selected_windows(ids, seqlen, max_windows, window_order)  # [n, T]
    nlls: list[float] = []
    for batch, logits in batch_logits(model, windows, batch_size, progress):  # [B, T], [B, T, V]
        for row in range(batch.shape[0]):
            nlls.append(summed_nll(logits[row, :-1], batch[row, 1:]) / (seqlen - 1))
        del logits
    return nlls


def selected_windows(ids: torch.Tensor, seqlen: int, max_windows: int | None = None,
                     window_order: str = "first") -> torch.Tensor:
    """[n, seqlen] the evaluated windows of `ids` ([1, L]): non-overlapping, remainder dropped."""
    total = ids.shape[1] // seqlen
    if total == 0:
        raise DataUnavailableError(f"the evaluation text has {ids.shape[1]} tokens: not one window "
                                   f"of {seqlen}; use more text or a smaller evaluation.perplexity.seqlen")
    windows = ids[0, : total * seqlen].view(total, seqlen)  # [total, T]
    n = total if max_windows is None else min(total, max_windows)
    if window_order == "spread":
        return windows[spread_indices(total, n)]  # [n, T]
    return windows[:n]


def spread_indices(total: int, n: int) -> torch.Tensor:
    """n window indices evenly spaced over 0..total-1 (all of them when n == total)."""
    return torch.div(torch.arange(n) * total, n, rounding_mode="floor")


def rolling_windows(tokenizer, text: str, max_length: int) -> list[tuple[list[int], list[int]]]:
    """(input ids, scored continuation) of each of lm-eval's disjoint rolling windows of a document."""
    from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

    tokens = tokenizer(text, add_special_tokens=False, verbose=False).input_ids
    prefix = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
    out = []
    for context, continuation in map(make_disjoint_window, get_rolling_token_windows(
            token_list=tokens, prefix_token=prefix, max_seq_len=max_length, context_len=1)):
        full = (context + continuation)[-(max_length + 1):]
        out.append((full[:-1], continuation))
    return out


@torch.no_grad()
def rolling_document_nll(model, tokenizer, text: str, max_length: int) -> float:
    """Total NLL of a document scored in lm-eval's disjoint rolling windows."""
    return rolling_nlls(model, tokenizer, [text], max_length, progress=False)[0]


@torch.no_grad()
def rolling_nlls(model, tokenizer, texts: list[str], max_length: int, progress: bool = True) -> list[float]:
    """Total NLL of each document in lm-eval's disjoint rolling windows, one window per forward.

    A streamed model runs the windows (each its own batch of one, as in the resident loop)
    through one decoder layer at a time, in groups that fit its activation budget."""
    windows = [(doc, ids, cont) for doc, text in enumerate(texts)
               for ids, cont in rolling_windows(tokenizer, text, max_length)]
    totals = [0.0] * len(texts)
    device = input_device(model)
    store = store_of(model)
    if store is None:
        for doc, ids, continuation in tqdm(windows, desc="word ppl windows", disable=not progress, leave=False):
            logits = model(input_ids=torch.tensor([ids], device=device), use_cache=False).logits[0]  # [T, V]
            totals[doc] += summed_nll(logits[-len(continuation):], torch.tensor(continuation, device=device))
        return totals
    adapter = ModelAdapter(model)
    per_token = 2 * adapter.hidden_size * 4  # input and output buffers
    group: list[tuple[int, list[int], list[int]]] = []
    for position, window in enumerate(windows):
        group.append(window)
        tokens = sum(len(ids) for _, ids, _ in group)
        if tokens * per_token < store.activation_budget_bytes and position < len(windows) - 1:
            continue
        captured = [capture_layer_inputs(adapter, torch.tensor([ids]), 1) for _, ids, _ in group]
        inputs = LayerInputs([c.hidden[0] for c in captured], [c.kwargs[0] for c in captured])
        runner = LayerSequentialRunner(adapter, inputs, progress=progress, desc="word ppl layers")
        for _ in runner:
            pass
        with adapter.outside_in_memory("head"):
            for (doc, _, continuation), hidden in zip(group, runner.outputs.hidden):  # [1, T, C]
                logits = adapter.logits_from_hidden(hidden)[0]  # [T, V]
                totals[doc] += summed_nll(logits[-len(continuation):], torch.tensor(continuation, device=device))
        group = []
    return totals


class PerplexityEvaluator:
    """Token and word perplexity on each evaluation corpus of the run."""

    name = "ppl"

    def __init__(self, spec: PerplexitySpec, corpora: tuple[str, ...], paths: tuple[str, ...] = (),
                 cache: TokenCache | None = None, progress: bool = True):
        self.spec = spec
        self.corpora = corpora
        self.paths = paths
        self.cache = cache
        self.progress = progress

    def protocol_stamps(self, model, tokenizer) -> dict[str, dict]:
        """Stamps that identify every metric this evaluator would produce (the dense-cache key),
        down to the sha256 of the evaluated tokens (token protocol) or documents (word)."""
        seqlen = effective_seqlen(model, self.spec.seqlen)
        return {
            f"ppl/{corpus}/{kind}": {
                "evaluator": "perplexity", "kind": kind, "dataset": corpus,
                "split": "validation" if corpus == "c4" else "test", "seqlen": seqlen,
                "max_windows": self.spec.max_windows, "tokenizer": tokenizer_fingerprint(tokenizer),
                "corpus_version": sources.corpus_version(corpus, self.paths),
                # stamped only when it departs from the reference protocol (older stamps stay valid)
                **({"window_order": self.spec.window_order} if self.spec.window_order != "first" else {}),
                "nll": NLL_ARITHMETIC,
                "content_sha256": self._content_sha256(corpus, kind, tokenizer, seqlen),
            }
            for corpus in self.corpora for kind in self.spec.protocols
        }

    def _content_sha256(self, corpus: str, kind: str, tokenizer, seqlen: int) -> str:
        """sha256 of exactly what would be evaluated: the windows' token ids or the documents."""
        if kind == "token":
            ids = eval_token_stream(corpus, tokenizer, seqlen, self.paths, self.cache)
            windows = selected_windows(ids, seqlen, self.spec.max_windows, self.spec.window_order)
            return tensor_sha256(windows.reshape(1, -1))[:32]
        docs = sources.word_perplexity_documents(corpus, self.paths)[: self.spec.max_windows]
        return hashlib.sha256(json.dumps(docs).encode()).hexdigest()[:32]

    def evaluate(self, model, tokenizer) -> dict[str, Metric]:
        results: dict[str, Metric] = {}
        model.eval()
        for key, stamp in self.protocol_stamps(model, tokenizer).items():
            corpus, kind, seqlen = stamp["dataset"], stamp["kind"], stamp["seqlen"]
            if kind == "token":
                ids = eval_token_stream(corpus, tokenizer, seqlen, self.paths, self.cache)
                nlls = window_nlls(model, ids, seqlen, self.spec.batch_size, self.spec.max_windows,
                                   self.progress, self.spec.window_order)
                value = math.exp(sum(nlls) * seqlen / (len(nlls) * seqlen))
                stamp = {**stamp, "windows": len(nlls), "tokens": len(nlls) * seqlen}
                samples = {"unit": "window", "values": nlls, "weights": [seqlen] * len(nlls)}
            else:
                docs = sources.word_perplexity_documents(corpus, self.paths)
                if self.spec.max_windows is not None:
                    docs = docs[: self.spec.max_windows]
                nlls = rolling_nlls(model, tokenizer, [scored for scored, _ in docs], seqlen, self.progress)
                words = [len(re.split(r"\s+", counted)) for _, counted in docs]
                value = math.exp(sum(nlls) / sum(words))
                stamp = {**stamp, "documents": len(docs), "words": sum(words)}
                samples = {"unit": "document", "values": [n / w for n, w in zip(nlls, words)],
                           "weights": words}
            results[key] = Metric(value=value, higher_is_better=False, protocol=stamp, samples=samples)
            log.info("%s = %.4f", key, value)
        return results
