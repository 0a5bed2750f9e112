"""Testbed language, tokenizer and tasks: deterministic, disjoint, well-formed, leak-free."""

import time

import pytest

from prunelab.testbed import corpus, tasks
from prunelab.testbed.tokenizer import TOKENIZER_DIR, load_tokenizer


def test_documents_are_deterministic_and_prefix_stable():
    first = corpus.documents("test", 50)
    assert first == corpus.documents("test", 50)
    assert corpus.documents("test", 10) == first[:10]
    stream = corpus.iter_documents("test")
    assert [next(stream) for _ in range(5)] == first[:5]


def test_documents_are_fast():
    started = time.perf_counter()
    corpus.documents("test", 2000)
    assert time.perf_counter() - started < 2.0


def test_splits_are_disjoint():
    splits = {split: set(corpus.documents(split, 500)) for split in corpus.SPLITS}
    assert not splits["train"] & splits["validation"]
    assert not splits["train"] & splits["test"]
    assert not splits["validation"] & splits["test"]


def test_unknown_split_is_rejected():
    with pytest.raises(ValueError):
        corpus.documents("dev", 1)


def test_world_is_fixed_and_large():
    assert len(corpus.WORLD) == corpus.NUM_PEOPLE >= 300
    assert len({p.name for p in corpus.WORLD}) == len(corpus.WORLD)
    assert corpus.build_world() == corpus.WORLD
    assert isinstance(corpus.CORPUS_VERSION, str)


def test_documents_are_paragraphs_of_reasonable_length():
    tokenizer = load_tokenizer()
    lengths = [len(ids) for ids in tokenizer(corpus.documents("validation", 300))["input_ids"]]
    assert 100 <= sum(lengths) / len(lengths) <= 400
    assert all("\n" not in doc for doc in corpus.documents("validation", 50))


def test_tokenizer_loads_with_auto_tokenizer_and_round_trips():
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(TOKENIZER_DIR))
    assert tokenizer.eos_token == tokenizer.bos_token == "<|endoftext|>"
    assert 256 < len(tokenizer) <= 4096
    text = corpus.documents("test", 1)[0] + "\n\nUnseen wörds 123!"
    assert tokenizer.decode(tokenizer(text)["input_ids"]) == text


def test_unigram_perplexity_is_a_sane_baseline():
    ppl = corpus.unigram_perplexity(load_tokenizer(), n=200, train_n=2000)
    assert 20 < ppl < 1000


@pytest.mark.parametrize("name", tasks.TASKS)
def test_task_items_are_well_formed(name):
    items = tasks.task_items(name, 200)
    assert items == tasks.task_items(name, 200)
    assert len(items) == 200
    golds = [item["gold"] for item in items]
    for item in items:
        assert set(item) == {"context", "choices", "gold"}
        assert len(item["choices"]) >= 2
        assert len(set(item["choices"])) == len(item["choices"])
        assert all(choice.startswith(" ") for choice in item["choices"])
        assert 0 <= item["gold"] < len(item["choices"])
    # chance is at most 50%, and always answering the same position does not beat it by much
    assert max(golds.count(g) for g in set(golds)) / len(golds) < 0.62


def test_at_least_six_tasks():
    assert len(tasks.TASKS) >= 6 and len(set(tasks.TASKS)) == len(tasks.TASKS)


@pytest.fixture(scope="module")
def training_sample():
    return "\n\n".join(corpus.documents("train", 4000))


@pytest.mark.parametrize("name", tasks.SKILL_TASKS)
def test_skill_items_are_absent_from_training_text(name, training_sample):
    for item in tasks.task_items(name, 300):
        assert item["context"] + item["choices"][item["gold"]] not in training_sample


def test_reserved_compositions_never_reach_training():
    train = corpus.documents("train", 1000)
    for head, _ in corpus.NOUNS:
        for attractor, _ in corpus.NOUNS:
            if head != attractor and corpus.is_reserved_agreement_pair(head, attractor):
                for prefix in ("near", "behind", "with", "beside", "that"):
                    assert not any(f"The {head} {prefix} the {attractor} " in d for d in train)
    text = " ".join(train)
    for a in range(corpus.MAX_OPERAND + 1):
        for b in range(corpus.MAX_OPERAND + 1):
            for op in ("plus", "minus"):
                if not corpus.is_training_sum(op, a, b):
                    problem = f"{corpus.number_word(a)} {op} {corpus.number_word(b)} is"
                    assert f": {problem}" not in text and f", {problem}" not in text


# Digest of the generated text (documents the shipped models were trained on, and task items).
# If documents changed: bump corpus.CORPUS_VERSION and retrain tokenizer and models; if only
# task items changed, re-run the model cards. Then update the digest here.
PINNED = {"tb-1": "353d773282578c474003c5b20b2b9f65cb5e424f66713e6c28e11849192e049c"}


def test_generated_text_matches_corpus_version():
    import hashlib
    import json

    digest = hashlib.sha256()
    for split in corpus.SPLITS:
        digest.update("\n".join(corpus.documents(split, 200)).encode())
    for name in tasks.TASKS:
        digest.update(json.dumps(tasks.task_items(name, 100)).encode())
    assert PINNED.get(corpus.CORPUS_VERSION) == digest.hexdigest()
