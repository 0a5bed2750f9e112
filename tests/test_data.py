"""Calibration sampling protocols, the token cache and the offline error."""

from __future__ import annotations

import random
import time

import pytest
import torch

from prunelab.data import CalibrationSpec, TokenCache, calibration_samples
from prunelab.data import sources
from prunelab.errors import ConfigError, DataUnavailableError


@pytest.fixture()
def tokenizer(tiny_model_dirs):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dirs["llama"])


def test_windows_come_from_the_joined_text_with_the_reference_draws(tokenizer, text_file):
    spec = CalibrationSpec(source="local_text", nsamples=5, seqlen=16, paths=(str(text_file),))
    got = calibration_samples(spec, tokenizer, seed=7)
    ids = tokenizer(text_file.read_text(), return_tensors="pt").input_ids
    random.seed(7)  # the reference: global random.seed, then randint per sample
    for row in got:
        i = random.randint(0, ids.shape[1] - 16 - 1)
        assert torch.equal(row, ids[0, i : i + 16])
    assert not torch.equal(got, calibration_samples(spec, tokenizer, seed=8))


def test_c4_protocol_skips_documents_not_longer_than_seqlen(tokenizer, monkeypatch):
    docs = ["short text", "the cat sat on the mat . " * 30, "tiny", "seven plus five is twelve . " * 30]
    monkeypatch.setattr(sources, "documents", lambda corpus, split, paths=(): docs)
    spec = CalibrationSpec(source="c4", nsamples=6, seqlen=20)
    got = calibration_samples(spec, tokenizer, seed=0)
    assert got.shape == (6, 20)
    random.seed(0)
    for row in got:
        while True:
            ids = tokenizer(docs[random.randint(0, len(docs) - 1)], return_tensors="pt").input_ids
            if ids.shape[1] > 20:
                break
        j = random.randint(0, ids.shape[1] - 20 - 1)
        assert torch.equal(row, ids[0, j : j + 20])


def test_cache_returns_the_stored_tensor_without_recomputing(tmp_path):
    cache = TokenCache(tmp_path)
    calls = []
    make = lambda: calls.append(1) or torch.arange(5)  # noqa: E731
    first = cache.get_or_compute({"k": 1}, make)
    second = cache.get_or_compute({"k": 1}, make)
    assert torch.equal(first, second) and len(calls) == 1
    cache.get_or_compute({"k": 2}, make)
    assert len(calls) == 2


def test_unreachable_hub_dataset_fails_fast_naming_the_offline_alternative(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(sources, "_hub_reachable", lambda timeout=3.0: False)
    start = time.perf_counter()
    with pytest.raises(DataUnavailableError, match="data=testbed"):
        sources.documents("wikitext2", "test")
    assert time.perf_counter() - start < 10


def test_local_text_needs_existing_files():
    with pytest.raises(ConfigError, match="not found"):
        CalibrationSpec(source="local_text", paths=("/no/such.txt",))
    with pytest.raises(ConfigError, match="must list"):
        CalibrationSpec(source="local_text")
