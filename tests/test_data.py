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


class FakeRows(dict):
    """What `datasets.load_dataset` returns, as far as the loaders use it."""

    def __getitem__(self, key):
        if isinstance(key, slice):
            return {"text": dict.__getitem__(self, "text")[key]}
        return dict.__getitem__(self, key)


def test_hub_eval_streams_follow_the_reference_joins(tokenizer, monkeypatch):
    from prunelab.data import eval_token_stream

    calls = []

    def fake_hub(path, name=None, split="train", **kwargs):
        calls.append((path, name, split, kwargs))
        rows = [f"row {i} the cat sat on the mat ." for i in range(2000)]
        return FakeRows(text=rows, sentence=rows)

    monkeypatch.setattr(sources, "load_hub_dataset", fake_hub)
    wikitext = eval_token_stream("wikitext2", tokenizer, seqlen=8)
    rows = [f"row {i} the cat sat on the mat ." for i in range(2000)]
    assert torch.equal(wikitext, tokenizer("\n\n".join(rows), return_tensors="pt").input_ids)
    assert calls[-1][:3] == ("wikitext", "wikitext-2-raw-v1", "test")

    c4 = eval_token_stream("c4", tokenizer, seqlen=8)
    joined = tokenizer(" ".join(rows[:1100]), return_tensors="pt").input_ids
    assert torch.equal(c4, joined[:, : 256 * 8])
    assert calls[-1][3]["data_files"] == {"validation": "en/c4-validation.00000-of-00008.json.gz"}

    ptb = eval_token_stream("ptb", tokenizer, seqlen=8)
    assert torch.equal(ptb, tokenizer(" ".join(rows), return_tensors="pt").input_ids)
    assert calls[-1][:3] == ("ptb_text_only", "penn_treebank", "test")



@pytest.fixture()
def long_texts_in_child(monkeypatch):
    from prunelab.data import tokens

    monkeypatch.setattr(tokens, "CHILD_MIN_CHARS", 1000)
    previous = tokens.tokenize_long_texts_in_child(True)
    yield tokens
    tokens.tokenize_long_texts_in_child(previous)


LONG_TEXT = " ".join(f"word{i} and more text, line {i}." for i in range(400))


def test_long_texts_tokenized_in_a_child_process_give_the_same_ids(tokenizer, long_texts_in_child, monkeypatch):
    tokens = long_texts_in_child
    here = tokens._encode_here(tokenizer, LONG_TEXT)
    monkeypatch.setattr(tokens, "_encode_here", lambda *_: pytest.fail("tokenized in this process"))
    in_child = tokens.encode(tokenizer, LONG_TEXT)
    assert in_child.dtype == here.dtype and torch.equal(in_child, here)


def test_a_child_that_cannot_tokenize_falls_back_to_this_process(tokenizer, long_texts_in_child, monkeypatch,
                                                                 caplog):
    tokens = long_texts_in_child
    monkeypatch.setattr(tokens.sys, "executable", "/bin/false")  # the child exits with 1
    assert torch.equal(tokens.encode(tokenizer, LONG_TEXT), tokens._encode_here(tokenizer, LONG_TEXT))
    assert "tokenizing in a child process failed (RuntimeError: exit 1" in caplog.text


def test_a_registered_corpus_calibrates_and_evaluates_like_a_shipped_one():
    from prunelab.data import CalibrationSpec, DataSpec
    from prunelab.data.sources import Corpus, corpus_version, documents, register_corpus

    rows = {"train": ["alpha beta gamma"] * 3, "test": ["delta epsilon"]}
    register_corpus("my_corpus", Corpus(documents=rows.__getitem__, version=lambda: "mine-1"))
    DataSpec(calibration=CalibrationSpec(source="my_corpus", nsamples=1, seqlen=4), eval_corpora=("my_corpus",))
    assert documents("my_corpus", "test") == ["delta epsilon"]
    assert corpus_version("my_corpus") == "mine-1"
    with pytest.raises(ConfigError, match="not one of"):
        CalibrationSpec(source="not_registered", nsamples=1, seqlen=4)


def test_the_testbed_corpus_comes_from_its_entry_point():
    from importlib import metadata

    (entry,) = metadata.entry_points(group="prunelab.corpora", name="testbed")
    assert entry.value == "prunelab.testbed.registered_corpus:CORPUS"
