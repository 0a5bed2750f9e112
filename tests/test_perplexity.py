"""Perplexity protocols against hand computations on a tiny model."""

from __future__ import annotations

import math

import pytest
import torch
from tiny import VOCAB

from prunelab.evaluation.perplexity import rolling_document_nll, summed_nll, window_nlls
from prunelab.models import ModelSpec, load_model


@pytest.fixture(scope="module")
def llama(tiny_model_dirs):
    return load_model(ModelSpec(name_or_path=str(tiny_model_dirs["llama"]), device="cpu"))


def hand_nll(model, ids: list[int]) -> float:
    """Sum of -log p(token_t | tokens_<t), one explicit softmax at a time."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0]
    total = 0.0
    for t in range(1, len(ids)):
        probs = torch.softmax(logits[t - 1].double(), dim=0)
        total -= math.log(probs[ids[t]].item())
    return total


def test_token_protocol_matches_hand_computation(llama):
    ids = torch.randint(0, VOCAB, (1, 3 * 16 + 5), generator=torch.Generator().manual_seed(1))
    nlls = window_nlls(llama.model, ids, seqlen=16, progress=False)
    assert len(nlls) == 3  # remainder of 5 tokens dropped
    for w, nll in enumerate(nlls):
        window = ids[0, w * 16 : (w + 1) * 16].tolist()
        assert nll == pytest.approx(hand_nll(llama.model, window) / 15, rel=1e-5)
    batched = window_nlls(llama.model, ids, seqlen=16, batch_size=2, progress=False)
    assert batched == pytest.approx(nlls, rel=1e-5)


def test_window_nll_equals_a_plain_per_window_loop(llama):
    """The evaluator's per-window NLL is the plain loop's (last-dimension loss, mean over the
    window's seqlen - 1 predictions), to 1e-6 relative."""
    ids = torch.randint(0, VOCAB, (1, 4 * 32), generator=torch.Generator().manual_seed(2))
    nlls = window_nlls(llama.model, ids, seqlen=32, progress=False)
    loss = torch.nn.CrossEntropyLoss()
    with torch.no_grad():
        for w, nll in enumerate(nlls):
            window = ids[:, w * 32 : (w + 1) * 32]  # [1, 32]
            logits = llama.model(input_ids=window, use_cache=False).logits[0]  # [32, V]
            assert nll == pytest.approx(float(loss(logits[:-1], window[0, 1:])), rel=1e-6)


def test_summed_nll_is_float64_accurate_at_a_real_vocabulary_size():
    """On a 49,152-word vocabulary (SmolLM2's) and a 511-position window, the chunked float64 sum
    is within 1e-6 of the loss computed entirely in float64, whatever the chunk."""
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(511, 49152, generator=gen) * 4  # [T, V]
    targets = torch.randint(0, 49152, (511,), generator=gen)
    exact = float(torch.nn.functional.cross_entropy(logits.double(), targets, reduction="sum"))
    for chunk in (1, 100, 128, 511, 4096):
        assert summed_nll(logits, targets, chunk) == pytest.approx(exact, rel=1e-6)


def test_word_protocol_rolls_disjoint_windows(llama):
    text = "the cat sat on the mat . " * 12
    tokens = llama.tokenizer(text, add_special_tokens=False).input_ids
    prefix = llama.tokenizer.bos_token_id
    max_len = 16
    # By hand: the first window predicts tokens[0:16] from [prefix] + tokens[0:15]; each later window
    # predicts the next up-to-16 tokens with the preceding tokens as context (window of max_len).
    expected = 0.0
    with torch.no_grad():
        for start in range(0, len(tokens), max_len):
            end = min(start + max_len, len(tokens))
            context = ([prefix] + tokens)[max(0, end - max_len) : end]  # inputs of the window
            logits = llama.model(input_ids=torch.tensor([context]), use_cache=False).logits[0]
            logp = torch.log_softmax(logits.double(), dim=-1)
            targets = tokens[start:end]
            for i, tok in enumerate(targets):
                expected -= logp[len(context) - len(targets) + i, tok].item()
    assert rolling_document_nll(llama.model, llama.tokenizer, text, max_len) == pytest.approx(expected, rel=1e-5)
