"""Multiple-choice log-likelihoods with each shared prefix computed once (lm-eval's numbers, less work).

lm-eval's HFLM scores every (context, choice) pair as its own sequence, so a 4-choice item runs its
context through the model four times. `SharedContextLM` is an HFLM whose `_loglikelihood_tokens`
groups the requests that start with the same tokens:

- requests with the same context (HellaSwag, ARC, OpenBookQA, BoolQ, RTE, MMLU with its few-shot
  examples): the prefix is the context, each request continues with its choice;
- requests with the same continuation after different contexts (WinoGrande's partial scoring: the
  sentence up to the blank, filled with each option, then the same rest of the sentence): the prefix
  is the contexts' longest common beginning, each request continues with the rest of its context
  and the continuation, of which only the continuation is scored.

For each batch of groups it

1. runs the prefixes once (left-padded, attention mask and explicit position ids), keeping the KV
   cache and the last position's log-probabilities (they score each remainder's first token);
2. repeats each prefix's cache row once per request and runs every remainder's tokens but the last
   (right-padded, in chunks of similar lengths) on top of it; the log-probability of remainder
   token i+1 is read at position i. A request's answer sums its last `len(continuation)` of them.

The tokens each request sees are HFLM's (context + continuation, one sequence), so the numbers are
HFLM's up to float rounding. Requests sharing no prefix, or whose tokens would not fit the model's
window (lm-eval then truncates from the left), go to HFLM's own `_loglikelihood_tokens` unchanged:
LAMBADA's single continuation per context mostly goes there (unless words and first tokens repeat).
The answers are lm-eval's `(sum log p, is greedy)` pairs, so lm-eval's tasks compute acc and
acc_norm from them as usual. Select with `evaluation.zeroshot.scorer=shared_context`.
"""

from __future__ import annotations

import copy
import inspect
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from lm_eval.models.huggingface import HFLM

Request = tuple[tuple[str, str], list[int], list[int]]


@dataclass(frozen=True)
class Group:
    """Requests that start with the same `prefix`; request i continues with `remainders[i]`, whose
    last `scored[i]` tokens are its continuation."""

    prefix: list[int]
    indices: list[int]
    remainders: list[list[int]]
    scored: list[int]


def _common_length(sequences: list[list[int]]) -> int:
    first = sequences[0]
    length = min(len(s) for s in sequences)
    for position in range(length):
        if any(s[position] != first[position] for s in sequences[1:]):
            return position
    return length


CALL_COST_TOKENS = 24  # one forward call costs about as much as this many more tokens (CPU, SmolLM2)


def _batches(lengths: list[int], max_rows: int, max_tokens: int, skip_empty: bool = False) -> list[list[int]]:
    """Indices, longest first, cut into padded batches of at most `max_rows` rows and `max_tokens`
    tokens (rows x the longest) that cost the least in all: each batch costs its padded tokens plus
    `CALL_COST_TOKENS` (a dynamic program over the sorted lengths). `skip_empty` leaves out zeros."""
    order = sorted((i for i, n in enumerate(lengths) if n > 0 or not skip_empty), key=lambda i: -lengths[i])
    best = [0.0] + [float("inf")] * len(order)  # best[j]: cheapest cut of the first j rows
    cut = [0] * (len(order) + 1)
    for j in range(1, len(order) + 1):
        for i in range(j, max(0, j - max_rows), -1):  # the last batch is rows i-1 .. j-1, widest first
            width = max(lengths[order[i - 1]], 1)
            if (j - i + 1) * width > max_tokens and i < j:
                break
            cost = best[i - 1] + CALL_COST_TOKENS + (j - i + 1) * width
            if cost < best[j]:
                best[j], cut[j] = cost, i - 1
    batches, j = [], len(order)
    while j > 0:
        batches.append(order[cut[j]:j])
        j = cut[j]
    return batches[::-1]


def _groups(requests: list[Request], max_length: int) -> tuple[list[Group], list[int]]:
    """The groups sharing a prefix (a context, or the beginning of contexts followed by the same
    continuation) whose requests fit the window, and the indices left for HFLM's own scoring."""
    fits = [len(context) + len(cont) <= max_length + 1 for _, context, cont in requests]
    by_context: dict[tuple[int, ...], list[int]] = {}
    for index, (_, context, _) in enumerate(requests):
        if fits[index] and context:
            by_context.setdefault(tuple(context), []).append(index)
    groups, rest = [], [i for i in range(len(requests)) if not fits[i] or not requests[i][1]]
    for context, indices in by_context.items():
        if len(indices) > 1:
            groups.append(Group(list(context), indices, [requests[i][2] for i in indices],
                                [len(requests[i][2]) for i in indices]))
        else:
            rest.extend(indices)
    by_continuation: dict[tuple[int, ...], list[int]] = {}
    for index in rest:
        if fits[index] and requests[index][1]:
            by_continuation.setdefault(tuple(requests[index][2]), []).append(index)
    alone = [i for i in rest if not fits[i] or not requests[i][1]]
    for cont, indices in by_continuation.items():
        shared = _common_length([requests[i][1] for i in indices]) if len(indices) > 1 else 0
        if shared == 0:
            alone.extend(indices)
            continue
        groups.append(Group(requests[indices[0]][1][:shared], indices,
                            [requests[i][1][shared:] + list(cont) for i in indices], [len(cont)] * len(indices)))
    return groups, sorted(alone)


class SharedContextLM(HFLM):
    """lm-eval's HFLM scoring requests that share a prefix from one pass over it (module docstring)."""

    def __init__(self, *args: Any, context_batch: int | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        size = self.batch_size if isinstance(self.batch_size, int) else 16
        self.context_batch = context_batch or 4 * size  # prefixes per call (each brings its requests)
        self.tail_batch = 4 * size  # remainders per call
        self.max_tokens = 128 * size  # padded tokens per call (bounds the logits' and the cache's memory)
        parameters = inspect.signature(self.model.forward).parameters
        self._keeps_logits = "logits_to_keep" in parameters
        self._cache_arg = "cache" if "cache" in parameters else "past_key_values"  # renamed in transformers 5.2x
        self._body, self._head = self._split_head()

    @torch.no_grad()
    def _split_head(self) -> tuple[Any, Any]:
        """The decoder and the output layer as two calls, when the model's logits are exactly
        `head(body(...).last_hidden_state)` (checked on a few tokens; not so for a model that scales or
        caps its logits): the remainders' output layer then runs on their scored positions only, not on
        padding or on the unscored part of WinoGrande's remainders. (None, None) otherwise."""
        body, head = getattr(self.model, "base_model", None), self.model.get_output_embeddings()
        if body is None or body is self.model or head is None:
            return None, None
        ids = torch.tensor([[1, 2, 3]], device=self.device)
        try:
            split = head(body(input_ids=ids, use_cache=False).last_hidden_state)
        except Exception:  # noqa: BLE001 - any model that does not split this way keeps the whole forward
            return None, None
        return (body, head) if torch.equal(split, self.model(input_ids=ids, use_cache=False).logits) else (None, None)

    def _loglikelihood_tokens(self, requests: list[Request], disable_tqdm: bool = False,
                              override_bs: int | None = None) -> list[tuple[float, bool]]:
        if self.backend != "causal":
            return super()._loglikelihood_tokens(requests, disable_tqdm, override_bs)
        groups, alone = _groups(requests, self.max_length)
        results: list[tuple[float, bool] | None] = [None] * len(requests)
        if alone:
            for index, answer in zip(alone, super()._loglikelihood_tokens([requests[i] for i in alone], True,
                                                                          override_bs)):
                results[index] = answer
        for chunk in _batches([len(group.prefix) for group in groups], self.context_batch, self.max_tokens):
            batch = [groups[g] for g in chunk]
            for group, answers in zip(batch, self._score_shared(batch)):
                for index, answer in zip(group.indices, answers):
                    results[index] = answer
                    self.cache_hook.add_partial("loglikelihood", requests[index][0], answer)
        return results  # type: ignore[return-value]

    @torch.no_grad()
    def _score_shared(self, batch: list[Group]) -> list[list[tuple[float, bool]]]:
        device, pad = self.device, 0
        lengths = [len(group.prefix) for group in batch]
        width = max(lengths)
        ids = torch.full((len(batch), width), pad, dtype=torch.long, device=device)  # [K, W] left-padded
        mask = torch.zeros((len(batch), width), dtype=torch.long, device=device)
        for row, group in enumerate(batch):
            ids[row, width - len(group.prefix):] = torch.tensor(group.prefix, device=device)
            mask[row, width - len(group.prefix):] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)  # [K, W]
        rows = [(k, remainder, scored) for k, group in enumerate(batch)
                for remainder, scored in zip(group.remainders, group.scored)]  # (prefix row, remainder, scored)
        tail_lengths = [len(remainder) - 1 for _, remainder, _ in rows]
        keep = {"logits_to_keep": 1} if self._keeps_logits else {}  # the output layer on the last position only
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions,
                         use_cache=any(tail_lengths), **keep)  # one-token remainders need no cache
        first = F.log_softmax(out.logits[:, -1], dim=-1, dtype=self.softmax_dtype)  # [K, V]: remainder token 1
        first_greedy = first.argmax(-1)  # [K]

        tails: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # row -> scored tokens 2..: log p, greedy
        for chunk in _batches(tail_lengths, self.tail_batch, self.max_tokens, skip_empty=True):
            tails.update(self._score_tails(chunk, rows, self._cache_of(out), mask, lengths))
        answers: list[tuple[float, bool]] = []
        for r, (k, remainder, scored) in enumerate(rows):
            logp, greedy = tails.get(r, (first.new_zeros(0), torch.ones(0, dtype=torch.bool, device=device)))
            total, all_greedy = float(logp.sum()), bool(greedy.all())
            if scored == len(remainder):  # the first remainder token is scored too: read off the prefix pass
                total = float(first[k, remainder[0]]) + total
                all_greedy = all_greedy and int(first_greedy[k]) == remainder[0]
            answers.append((total, all_greedy))
        grouped, at = [], 0
        for group in batch:
            grouped.append(answers[at:at + len(group.indices)])
            at += len(group.indices)
        return grouped

    def _cache_of(self, out):
        """The output's KV cache: `cache` in transformers 5.2x (`past_key_values` before, now a warning)."""
        return getattr(out, self._cache_arg) if self._cache_arg in getattr(out, "keys", lambda: ())() else out.past_key_values

    def _score_tails(self, chunk: list[int], rows: list[tuple[int, list[int], int]], base_cache,
                     mask: torch.Tensor, lengths: list[int]) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
        """The scored remainder tokens after the first of `chunk`'s rows: their log-probabilities and
        whether each is the greedy choice, from every remainder token but the last run on a copy of
        their prefix's cache."""
        device = self.device
        width = max(len(rows[r][1]) for r in chunk) - 1
        source = torch.tensor([rows[r][0] for r in chunk], device=device)  # [R] prefix row of each
        cache = _rows_of(base_cache, source)  # [R, ...]: each prefix row once per request of this chunk
        ids = torch.zeros((len(chunk), width), dtype=torch.long, device=device)  # [R, T] right-padded
        take_row, take_col, targets, counts = [], [], [], []
        for i, r in enumerate(chunk):
            remainder, scored = rows[r][1], rows[r][2]
            ids[i, :len(remainder) - 1] = torch.tensor(remainder[:-1], device=device)
            first_col = max(len(remainder) - scored, 1) - 1  # position j predicts remainder token j + 1
            cols = range(first_col, len(remainder) - 1)
            take_row += [i] * len(cols)
            take_col += list(cols)
            targets += remainder[first_col + 1:]
            counts.append(len(cols))
        start = torch.tensor([lengths[rows[r][0]] for r in chunk], device=device)  # [R]
        positions = start[:, None] + torch.arange(width, device=device)[None, :]  # [R, T]
        full_mask = torch.cat([mask[source], torch.ones((len(chunk), width), dtype=mask.dtype, device=device)],
                              dim=1)  # the right padding comes after every real token: causal, never seen
        inputs = {"input_ids": ids, "attention_mask": full_mask, "position_ids": positions, "use_cache": True,
                  self._cache_arg: cache}
        where = (torch.tensor(take_row, device=device), torch.tensor(take_col, device=device))
        if self._head is not None:
            logits = self._head(self._body(**inputs).last_hidden_state[where])  # [N, V]: scored positions only
        else:
            logits = self.model(**inputs).logits[where]  # [N, V]
        logp = F.log_softmax(logits, dim=-1, dtype=self.softmax_dtype)
        targets_t = torch.tensor(targets, device=device)
        picked = logp.gather(1, targets_t[:, None])[:, 0]  # [N]
        greedy = logp.argmax(-1) == targets_t  # [N]
        return {r: (p, g) for r, p, g in zip(chunk, picked.split(counts), greedy.split(counts))}


def _rows_of(cache, rows: torch.Tensor):
    """A cache holding `rows` of `cache` (repeats allowed), `cache` itself untouched: the layers'
    `reorder_cache` assigns new tensors, so copying the layer objects suffices (no tensor copied twice)."""
    if hasattr(cache, "layers"):
        selected = copy.copy(cache)
        selected.layers = [copy.copy(layer) for layer in cache.layers]
    else:
        selected = copy.deepcopy(cache)
    selected.reorder_cache(rows)
    return selected
