"""Zero-shot multiple-choice tasks over the testbed language, scored lm-eval style.

Each item is ``{"context": str, "choices": list[str], "gold": int}``; a model is right when the
log-likelihood of ``context + choices[gold]`` beats every other choice. Choices start with a space
and there are always two of them (chance = 50%).

Skill tasks test generalisation, so their items are fresh compositions that never occur in
training text: agreement uses (head, attractor) noun pairs reserved by
``corpus.is_reserved_agreement_pair``; arithmetic uses only problems outside the training set
``corpus.is_training_sum`` (about a fifth of all problems); pronoun and tracking stories come
from a separate seed stream.
Fact tasks (city, job, colour, pet) test memorised world facts by design.
"""

from __future__ import annotations

import random

from prunelab.testbed import corpus

TASKS: tuple[str, ...] = (
    "tb_agreement", "tb_pronoun", "tb_tracking", "tb_tracking_long", "tb_arithmetic",
    "tb_city", "tb_job", "tb_colour", "tb_pet",
)
VERSION = corpus.CORPUS_VERSION  # the items change only with the generator
SKILL_TASKS = ("tb_agreement", "tb_pronoun", "tb_tracking", "tb_tracking_long", "tb_arithmetic")
FACT_TASKS = ("tb_city", "tb_job", "tb_colour", "tb_pet")


def _item(rng: random.Random, context: str, right: str, wrong: str) -> dict:
    """Two-choice item with the gold position chosen at random."""
    gold = rng.randrange(2)
    choices = [f" {wrong}", f" {wrong}"]
    choices[gold] = f" {right}"
    return {"context": context, "choices": choices, "gold": gold}


def _agreement(rng: random.Random) -> dict:
    phrase, plural = corpus.agreement_subject(rng, train=False)
    past = rng.random() < 0.4
    right = corpus.agreement_verb(plural, past)
    wrong = corpus.agreement_verb(not plural, past)
    return _item(rng, phrase[0].upper() + phrase[1:], right, wrong)


def _story_until(rng: random.Random, accept, num_people: int | None = None,
                 num_objects: int | None = None, events: tuple[int, int] = (3, 8),
                 ) -> tuple[corpus.Story, list[str]]:
    """Run a story (status lines as often as in training) until ``accept(state)`` holds."""
    while True:
        state = corpus.Story(rng, num_people, num_objects)
        sentences = [state.opening()]
        for _ in range(rng.randint(*events)):
            sentences.append(state.step())
            if rng.random() < 0.35:
                sentences.append(state.status(rng.choice(state.objects)))
        if accept(state):
            return state, sentences


def _pronoun(rng: random.Random) -> dict:
    """The pronoun after "X takes the obj and then" must match X's gender."""
    def mixed_genders_and_held(state):
        genders = {p in corpus.FEMALE_SET for p in state.people}
        return len(genders) == 2 and any(state.holder[o] for o in state.objects)

    state, sentences = _story_until(rng, mixed_genders_and_held)
    obj = rng.choice([o for o in state.objects if state.holder[o]])
    holder = state.holder[obj]
    sentences.append(f"{holder} takes the {obj} and then")
    female = holder in corpus.FEMALE_SET
    return _item(rng, " ".join(sentences), "she" if female else "he", "he" if female else "she")


def _tracking(rng: random.Random, long: bool = False) -> dict:
    """"Now the obj is with" must name the current holder, not an earlier one.

    ``long``: three people, two objects and 8-14 events, so more state must be carried.
    """
    def handed_over(state):
        return any(state.holder[o] and state.previous_holders[o] for o in state.objects)

    if long:
        state, sentences = _story_until(rng, handed_over, 3, 2, (8, 14))
    else:
        state, sentences = _story_until(rng, handed_over)
    obj = rng.choice([o for o in state.objects if state.holder[o] and state.previous_holders[o]])
    holder = state.holder[obj]
    earlier = [p for p in state.previous_holders[obj] if p != holder]
    distractor = earlier[-1] if earlier else rng.choice([p for p in state.people if p != holder])
    sentences.append(f"Now the {obj} is with")
    return _item(rng, " ".join(sentences), holder, distractor)


def _arithmetic(rng: random.Random) -> dict:
    """A sum never seen in training; the wrong answer is 4-9 away (tests number sense)."""
    problem, result = corpus.arithmetic_problem(rng, train=False)
    offsets = [o for o in range(-9, 10) if abs(o) >= 4 and result + o >= 0]
    wrong = result + rng.choice(offsets)
    name = rng.choice(corpus.FEMALE_NAMES + corpus.MALE_NAMES)
    context = f"{name} did some sums: {problem} is"
    return _item(rng, context, corpus.number_word(result), corpus.number_word(wrong))


_FACT_TEMPLATES = {
    "tb_city": ("city", corpus.CITIES, "{name} lives in"),
    "tb_job": ("job", corpus.JOBS, "{name} works as a"),
    "tb_colour": ("colour", corpus.COLOURS, "The favourite colour of {name} is"),
    "tb_pet": ("pet", corpus.PETS, "{name} has a pet"),
}


def _fact_items(name: str, n: int, rng: random.Random) -> list[dict]:
    """One item per person (cycling through the world in a fixed shuffled order)."""
    attribute, values, template = _FACT_TEMPLATES[name]
    people = list(corpus.WORLD)
    rng.shuffle(people)
    items = []
    for index in range(n):
        person = people[index % len(people)]
        right = getattr(person, attribute)
        wrong = rng.choice([value for value in values if value != right])
        items.append(_item(rng, template.format(name=person.name), right, wrong))
    return items


_SKILL_BUILDERS = {
    "tb_agreement": _agreement, "tb_pronoun": _pronoun,
    "tb_tracking": _tracking, "tb_arithmetic": _arithmetic,
    "tb_tracking_long": lambda rng: _tracking(rng, long=True),
}


def task_items(name: str, n: int = 500) -> list[dict]:
    """The first ``n`` items of task ``name`` (deterministic)."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; expected one of {TASKS}")
    rng = random.Random(f"{corpus.CORPUS_VERSION}:task:{name}")
    if name in _FACT_TEMPLATES:
        return _fact_items(name, n, rng)
    return [_SKILL_BUILDERS[name](rng) for _ in range(n)]
