"""Zero-shot multiple-choice tasks built from the held-out documents of the `realtext` corpus.

Items come only from `test` documents (never calibration text), drawn round-robin over documents
with a seed fixed by the corpus version, so every run grades the same items. Each item is
``{"context": str, "choices": list[str], "gold": int}``, run through lm-eval like the testbed's.

- `rt_lastword` (LAMBADA-style cloze, 4 choices, chance 25%): a passage of 24 words; the
  answer is its last word, chosen among words that already occur in the passage (so the context
  holds the cue, as in LAMBADA); the distractors are three other such words of the same passage.
- `rt_nextline` (3 choices, chance 33%): two lines of a play or of the docs; which line comes
  next: the true one, or one of two lines of similar length from elsewhere in the document.
- `rt_wordorder` (2 choices, chance 50%): after one line of context, the true next line or the
  same line with two adjacent words swapped (a BLiMP-style minimal pair: same tokens, other order).
"""

from __future__ import annotations

import random
import re
from functools import lru_cache

from prunelab.data import realtext

TASKS: tuple[str, ...] = ("rt_lastword", "rt_nextline", "rt_wordorder")
CHANCE = {"rt_lastword": 1 / 4, "rt_nextline": 1 / 3, "rt_wordorder": 1 / 2}
VERSION = f"{realtext.CORPUS_VERSION}-tasks-3"  # bump whenever a builder changes

_WORD = re.compile(r"[A-Za-z][a-z]{3,}")  # plain words of 4+ letters (no names in capitals, no code)
_PASSAGE_WORDS = 24
_CONTEXT_LINES = 2
_MIN_LINE_WORDS = 5
_MAX_LINE_CHARS = 90


@lru_cache(maxsize=64)
def _word_spans(text: str) -> tuple[tuple[int, int], ...]:
    return tuple((m.start(), m.end()) for m in re.finditer(r"\S+", text))


@lru_cache(maxsize=64)
def _lines(text: str) -> tuple[str, ...]:
    """Lines worth asking about: prose or verse, not speaker tags, stage directions or code."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        words = line.split()
        if (len(words) >= _MIN_LINE_WORDS and len(line) <= _MAX_LINE_CHARS and not line.startswith("[")
                and sum(w[0].isalpha() for w in words) >= len(words) - 1):
            out.append(line)
    return tuple(out)


def _choices(rng: random.Random, right: str, wrong: list[str]) -> tuple[list[str], int]:
    options = [right, *wrong]
    rng.shuffle(options)
    return options, options.index(right)


def _lastword(rng: random.Random, text: str) -> dict | None:
    spans = _word_spans(text)
    if len(spans) <= _PASSAGE_WORDS:
        return None
    end = rng.randrange(_PASSAGE_WORDS, len(spans))
    start_char, target_start = spans[end - _PASSAGE_WORDS][0], spans[end][0]
    target = re.fullmatch(r"([A-Za-z][a-z]{3,})[.,;:!?]?", text[spans[end][0]:spans[end][1]])
    context = text[start_char:target_start].rstrip()
    if target is None:
        return None
    seen = {w.lower() for w in _WORD.findall(context)}
    word = target.group(1)
    if word.lower() not in seen:
        return None
    others = sorted(seen - {word.lower()})
    if len(others) < 3:
        return None
    wrong = [w if word[0].islower() else w.capitalize() for w in rng.sample(others, 3)]
    options, gold = _choices(rng, word, wrong)
    return {"context": context, "choices": [f" {w}" for w in options], "gold": gold}


def _nextline(rng: random.Random, text: str) -> dict | None:
    lines = _lines(text)
    if len(lines) < 20:
        return None
    i = rng.randrange(_CONTEXT_LINES, len(lines))
    right, context = lines[i], lines[i - _CONTEXT_LINES:i]
    size = len(right.split())
    nearby = set(lines[max(0, i - 5):i + 6])  # never the context itself or the lines around it
    pool = sorted({line for line in lines if abs(len(line.split()) - size) <= 1} - nearby)
    if len(pool) < 2:
        return None
    options, gold = _choices(rng, right, rng.sample(pool, 2))
    return {"context": "\n".join(context), "choices": [f"\n{o}" for o in options], "gold": gold}


def _wordorder(rng: random.Random, text: str) -> dict | None:
    lines = _lines(text)
    if len(lines) < 2:
        return None
    i = rng.randrange(1, len(lines))
    words = lines[i].split()
    j = rng.randrange(0, len(words) - 1)
    if words[j].lower() == words[j + 1].lower():
        return None
    swapped = [*words[:j], words[j + 1], words[j], *words[j + 2:]]
    options, gold = _choices(rng, lines[i], [" ".join(swapped)])
    return {"context": lines[i - 1], "choices": [f"\n{o}" for o in options], "gold": gold}


_BUILDERS = {"rt_lastword": _lastword, "rt_nextline": _nextline, "rt_wordorder": _wordorder}


def task_items(name: str, n: int = 200) -> list[dict]:
    """The first ``n`` items of task ``name`` (deterministic), round-robin over test documents."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; expected one of {TASKS}")
    rng = random.Random(f"{VERSION}:{name}")
    docs = realtext.documents("test")
    items, attempts = [], 0
    while len(items) < n:
        attempts += 1
        if attempts > 200 * n:
            raise RuntimeError(f"{name}: only {len(items)} of {n} items could be built")
        item = _BUILDERS[name](rng, docs[attempts % len(docs)])
        if item is not None and item not in items:
            items.append(item)
    return items
