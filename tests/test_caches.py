"""Issue 13, item 1: caches keyed by content, checked before use, rebuilt when damaged."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from prunelab.data import TokenCache, sources
from prunelab.errors import StorageError
from prunelab.evaluation import dense_cache
from prunelab.evaluation.perplexity import PerplexityEvaluator, PerplexitySpec
from prunelab.files import atomic_write

SRC = Path(__file__).resolve().parents[1] / "src"


def _twins(tmp_path: Path) -> tuple[Path, Path]:
    """Two files with the same name and size but different text."""
    a, b = tmp_path / "a" / "corpus.txt", tmp_path / "b" / "corpus.txt"
    for path, word in ((a, "cat"), (b, "dog")):
        path.parent.mkdir()
        path.write_text(f"the {word} sat on the mat . " * 200)
    assert a.stat().st_size == b.stat().st_size
    return a, b


def test_same_name_and_size_or_an_edit_in_place_never_share_a_cache(tmp_path, tiny_model_dirs):
    a, b = _twins(tmp_path)
    assert sources.corpus_version("local_text", (str(a),)) != sources.corpus_version("local_text", (str(b),))
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dirs["llama"])
    cache = TokenCache(tmp_path / "tokens")
    spec = PerplexitySpec(seqlen=16, max_windows=2)
    stamp = lambda path: PerplexityEvaluator(spec, ("local_text",), (str(path),), cache).protocol_stamps(  # noqa: E731
        type("M", (), {"config": None})(), tokenizer)["ppl/local_text/token"]
    first = stamp(a)
    assert first != stamp(b) and first["content_sha256"] != stamp(b)["content_sha256"]
    a.write_text(a.read_text().replace("cat", "cow"))  # same size, edited in place
    assert stamp(a)["content_sha256"] != first["content_sha256"]


def test_a_truncated_or_edited_token_cache_is_rebuilt_with_a_notice(tmp_path, caplog):
    cache = TokenCache(tmp_path)
    value = torch.arange(100).view(1, 100)
    assert torch.equal(cache.get_or_compute({"k": 1}, lambda: value), value)
    [path] = tmp_path.glob("*.safetensors")
    data = path.read_bytes()
    path.write_bytes(data[:-7])  # truncated
    with caplog.at_level(logging.WARNING):
        assert torch.equal(cache.get_or_compute({"k": 1}, lambda: value), value)
    assert "unreadable" in caplog.text and "rebuilt" in caplog.text
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF  # one token id edited
    path.write_bytes(bytes(data))
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert torch.equal(cache.get_or_compute({"k": 1}, lambda: value), value)
    assert "checksum" in caplog.text
    assert sorted(p.suffix for p in tmp_path.iterdir()) == [".safetensors"]  # nothing else left


def test_dense_metrics_cache_is_checked_against_model_stamps_and_checksum(tmp_path):
    identity, stamps = {"source": "m", "files": [["w", "abc"]]}, {"ppl/x/token": {"seqlen": 8, "content_sha256": "t1"}}
    metrics = {"ppl/x/token": {"value": 3.0, "protocol": {"seqlen": 8, "content_sha256": "t1", "windows": 2}}}
    path = dense_cache.cache_file(tmp_path, identity, stamps)
    dense_cache.write(path, identity, stamps, metrics)
    assert dense_cache.read_checked(path, identity, stamps) == (metrics, "")
    assert "other model" in dense_cache.read_checked(path, {**identity, "files": [["w", "xyz"]]}, stamps)[1]
    other = {"ppl/x/token": {"seqlen": 8, "content_sha256": "t2"}}
    assert "protocol" in dense_cache.read_checked(path, identity, other)[1]
    entry = json.loads(path.read_text())
    entry["metrics"]["ppl/x/token"]["value"] = 2.0  # edited by hand
    path.write_text(json.dumps(entry))
    assert "checksum" in dense_cache.read_checked(path, identity, stamps)[1]
    path.write_text(path.read_text()[:40])  # truncated
    assert "unreadable" in dense_cache.read_checked(path, identity, stamps)[1]


def test_a_failed_write_leaves_no_temporary_file(tmp_path):
    def fail(handle):
        handle.write(b"half")
        raise OSError(28, "No space left on device")

    with pytest.raises(StorageError, match="no space left"):
        atomic_write(tmp_path / "x.json", fail, "a test file")
    assert list(tmp_path.iterdir()) == []


def test_no_torch_load_without_weights_only():
    for path in SRC.rglob("*.py"):
        for call in re.findall(r"torch\.load\([^)]*\)", path.read_text()):
            assert "weights_only=True" in call, f"{path}: {call}"
