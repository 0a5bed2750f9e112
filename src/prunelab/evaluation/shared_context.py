"""Multiple-choice log-likelihoods with each shared context computed once (lm-eval's numbers, less work).

lm-eval's HFLM scores every (context, choice) pair as its own sequence, so a 4-choice item runs its
context through the model four times. `SharedContextLM` is an HFLM whose `_loglikelihood_tokens`
groups the requests by context tokens and, for groups of two or more:

1. runs a batch of contexts once (left-padded, attention mask and explicit position ids), keeping
   the KV cache and the last position's log-probabilities (they score each choice's first token);
2. repeats each context's cache row once per choice and runs every choice's tokens but the last
   (right-padded, in chunks of similar lengths) on top of it; the log-probability of choice token
   i+1 is read at position i.

Where the choices change the context (WinoGrande: one continuation after two contexts), a context is
shared by one request only, or context + choice would not fit the model's window (lm-eval then
truncates from the left), the requests go to HFLM's own `_loglikelihood_tokens` unchanged. The
answers are lm-eval's `(sum log p, is greedy)` pairs, so lm-eval's tasks compute acc and acc_norm
from them as usual. Select with `evaluation.zeroshot.scorer=shared_context`.
"""

from __future__ import annotations

import copy
import inspect
from typing import Any

import torch
import torch.nn.functional as F
from lm_eval.models.huggingface import HFLM

Request = tuple[tuple[str, str], list[int], list[int]]


def _groups(requests: list[Request], max_length: int) -> tuple[list[tuple[list[int], list[int]]], list[int]]:
    """(context tokens, request indices) of contexts shared by 2+ requests that fit the window, and
    the indices left for HFLM's own scoring."""
    by_context: dict[tuple[int, ...], list[int]] = {}
    for index, (_, context, _) in enumerate(requests):
        by_context.setdefault(tuple(context), []).append(index)
    shared, alone = [], []
    for context, indices in by_context.items():
        fits = all(len(context) + len(requests[i][2]) <= max_length + 1 for i in indices)
        if len(indices) > 1 and fits and len(context) > 0:
            shared.append((list(context), indices))
        else:
            alone.extend(indices)
    return shared, alone


class SharedContextLM(HFLM):
    """HFLM computing each shared multiple-choice context once (see the module docstring)."""

    def __init__(self, *args: Any, context_batch: int | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        size = self.batch_size if isinstance(self.batch_size, int) else 16
        self.context_batch = context_batch or size  # contexts per call (each brings its choices)
        parameters = inspect.signature(self.model.forward).parameters
        self._keeps_logits = "logits_to_keep" in parameters
        self._cache_arg = "cache" if "cache" in parameters else "past_key_values"  # renamed in transformers 5.2x

    def _loglikelihood_tokens(self, requests: list[Request], disable_tqdm: bool = False,
                              override_bs: int | None = None) -> list[tuple[float, bool]]:
        if self.backend != "causal":
            return super()._loglikelihood_tokens(requests, disable_tqdm, override_bs)
        shared, alone = _groups(requests, self.max_length)
        results: list[tuple[float, bool] | None] = [None] * len(requests)
        if alone:
            for index, answer in zip(alone, super()._loglikelihood_tokens([requests[i] for i in alone], True,
                                                                          override_bs)):
                results[index] = answer
        shared.sort(key=lambda group: -len(group[0]))  # contexts of similar lengths together: little padding
        for start in range(0, len(shared), self.context_batch):
            batch = shared[start:start + self.context_batch]
            answers = self._score_shared(batch, requests)
            for (_, indices), group_answers in zip(batch, answers):
                for index, answer in zip(indices, group_answers):
                    results[index] = answer
                    self.cache_hook.add_partial("loglikelihood", requests[index][0], answer)
        return results  # type: ignore[return-value]

    @torch.no_grad()
    def _score_shared(self, batch: list[tuple[list[int], list[int]]],
                      requests: list[Request]) -> list[list[tuple[float, bool]]]:
        device, pad = self.device, 0
        lengths = [len(context) for context, _ in batch]
        width = max(lengths)
        ids = torch.full((len(batch), width), pad, dtype=torch.long, device=device)  # [K, W] left-padded
        mask = torch.zeros((len(batch), width), dtype=torch.long, device=device)
        for row, (context, _) in enumerate(batch):
            ids[row, width - len(context):] = torch.tensor(context, device=device)
            mask[row, width - len(context):] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)  # [K, W]
        keep = {"logits_to_keep": 1} if self._keeps_logits else {}  # the output layer on the last position only
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, **keep)
        first = F.log_softmax(out.logits[:, -1], dim=-1, dtype=self.softmax_dtype)  # [K, V]: each choice's 1st token

        rows = [(k, requests[i][2]) for k, (_, indices) in enumerate(batch) for i in indices]  # (context row, choice)
        tails: dict[int, torch.Tensor] = {}  # row -> log-probs of its choice tokens 2.. [len(cont) - 1, V]
        for chunk in self._tail_chunks([len(cont) - 1 for _, cont in rows]):
            tails.update(self._score_tails(chunk, rows, out.past_key_values, mask, lengths))
        answers: list[tuple[float, bool]] = []
        for r, (k, cont) in enumerate(rows):
            logp = first[k:k + 1] if r not in tails else torch.cat([first[k:k + 1], tails[r]])  # [len(cont), V]
            tokens = torch.tensor(cont, device=device)
            greedy = bool((logp.argmax(-1) == tokens).all())
            answers.append((float(logp.gather(1, tokens[:, None]).sum()), greedy))
        grouped, at = [], 0
        for _, indices in batch:
            grouped.append(answers[at:at + len(indices)])
            at += len(indices)
        return grouped

    def _tail_chunks(self, tails: list[int]) -> list[list[int]]:
        """Rows with choice tokens beyond the first, longest first, in chunks of similar length (a new
        chunk when a row is under half the chunk's longest, or at 4 x batch_size rows): little padding."""
        order = sorted((r for r, n in enumerate(tails) if n > 0), key=lambda r: -tails[r])
        chunks: list[list[int]] = []
        cap = 4 * (self.batch_size if isinstance(self.batch_size, int) else 16)
        for r in order:
            if chunks and len(chunks[-1]) < cap and 2 * tails[r] >= tails[chunks[-1][0]]:
                chunks[-1].append(r)
            else:
                chunks.append([r])
        return chunks

    def _score_tails(self, chunk: list[int], rows: list[tuple[int, list[int]]], base_cache, mask: torch.Tensor,
                     lengths: list[int]) -> dict[int, torch.Tensor]:
        """Every choice token but the first and last of `chunk`'s rows, run on a copy of their context's cache."""
        device = self.device
        width = max(len(rows[r][1]) for r in chunk) - 1
        source = torch.tensor([rows[r][0] for r in chunk], device=device)  # [R] context row of each
        cache = copy.deepcopy(base_cache)
        cache.reorder_cache(source)  # [R, ...]: each context row once per choice of this chunk
        ids = torch.zeros((len(chunk), width), dtype=torch.long, device=device)  # [R, T] right-padded
        for i, r in enumerate(chunk):
            cont = rows[r][1]
            ids[i, :len(cont) - 1] = torch.tensor(cont[:-1], device=device)
        start = torch.tensor([lengths[rows[r][0]] for r in chunk], device=device)  # [R]
        positions = start[:, None] + torch.arange(width, device=device)[None, :]  # [R, T]
        full_mask = torch.cat([mask[source], torch.ones((len(chunk), width), dtype=mask.dtype, device=device)],
                              dim=1)  # the right padding comes after every real token: causal, never seen
        logits = self.model(input_ids=ids, attention_mask=full_mask, position_ids=positions, use_cache=True,
                            **{self._cache_arg: cache}).logits  # [R, T, V]
        return {r: F.log_softmax(logits[i, :len(rows[r][1]) - 1], dim=-1, dtype=self.softmax_dtype)
                for i, r in enumerate(chunk)}
