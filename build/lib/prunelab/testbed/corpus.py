"""Deterministic generator of the testbed language: English-like paragraphs over a fixed world.

Why: nothing can be downloaded, yet pruning studies need a model whose behaviour resembles a
real LLM's: it must memorise facts (knowledge stored in MLP weights) and use depth for skills
(agreement across clauses, pronouns, entity tracking, arithmetic). This module writes such text.

The world (fixed by ``WORLD_SEED``)
    ``NUM_PEOPLE`` people, each a unique "First Last" name. The first name fixes the gender
    (she/he, her/his). Every person has memorised facts: city, job, favourite colour, pet,
    favourite food, game, birth month and (for people sharing a surname) a sibling.

Sentence families (a document is one paragraph mixing 3-6 segments of these)
    * biography: "Anna Berg lives in Oslo. She works as a baker. Her favourite colour is red."
      Facts always come from the world; later sentences use pronouns or the full name.
    * fact summary: "Tom Lund lives in Rome and works as a pilot."
    * agreement: subject-verb number agreement across prepositional phrases and (nested)
      relative clauses, e.g. "The keys that the man near the doors holds are old."
      (head noun, first attractor) pairs with ``is_reserved_agreement_pair`` never occur here:
      they are kept for evaluation items.
    * story (entity tracking): first names only; people pick up, give and drop objects and move
      between rooms; "Now the cup is with Maria." states the current holder, and pronouns refer
      to the actor ("Tom picks up the key and then he goes to the hall.").
    * arithmetic: "Lena did some sums: seven plus five is twelve, nine minus four is five."
      Operands 0-12. Training text only uses the ordered (op, a, b) problems selected by
      ``is_training_sum`` (about one in five); evaluation items use only the other problems, so
      arithmetic accuracy measures generalisation to sums never seen in training.

Splits ("train", "validation", "test") are disjoint seeded streams: document ``i`` of split
``s`` is generated from its own ``random.Random(f"{CORPUS_VERSION}:{s}:{i}")``, so any prefix is
reproducible on every machine (str seeds are hashed with SHA-512, not Python's ``hash``).
"""

from __future__ import annotations

import collections
import itertools
import math
import random
import zlib
from collections.abc import Iterator
from dataclasses import dataclass

CORPUS_VERSION = "tb-1"
WORLD_SEED = 20240601
NUM_PEOPLE = 400
SPLITS = ("train", "validation", "test")

FEMALE_NAMES = (
    "Anna Maria Lena Sara Emma Julia Clara Nora Eva Ida Alice Olga Rosa Vera Irene Hanna Laura "
    "Lucy Mia Nina Paula Rita Sofia Tina Zoe Greta Helen Kate Lisa Mona"
).split()
MALE_NAMES = (
    "Tom Paul Max Leo Otto Hugo Karl Ivan Oscar Felix Victor Adam Ben David Erik Frank Jack "
    "Luke Mark Noah Peter Sam Simon Tim Walter Henry Louis Carl Dan Fred"
).split()
SURNAMES = (
    "Berg Lund Stone Weber Fox Hill Moss Reed Grant Blake Carter Dunn Ellis Ford Gray Hale "
    "Hart Kent Lane Marsh Nash Park Price Quinn Rowe Shaw Tate Vale Wade Young Brook Cole "
    "Dale Frost Green Hunt Knight Lowe Mills North"
).split()
CITIES = (
    "Oslo Rome Paris Berlin Madrid Vienna Prague Dublin Lisbon Athens Warsaw Cairo Lima Tokyo "
    "Delhi Sydney Boston Denver Dallas Chicago Toronto Quebec Havana Nairobi Seoul Manila Dakar "
    "Bogota Riga Milan"
).split()
JOBS = (
    "baker teacher doctor farmer pilot nurse painter singer driver cook lawyer dentist tailor "
    "writer miner sailor potter barber builder porter dancer gardener banker butcher carpenter "
    "fisher hunter jeweller plumber soldier"
).split()
COLOURS = "red blue green yellow purple orange black white pink brown grey silver".split()
PETS = "dog cat parrot rabbit horse goat turtle hamster snake pony duck mouse".split()
FOODS = "bread soup rice cheese apples pears noodles cake beans plums eggs carrots pasta".split()
GAMES = "chess tennis golf football cards hockey rugby cricket bridge darts poker".split()
MONTHS = (
    "January February March April May June July August September October November December"
).split()
ROOMS = "kitchen garden hall library office yard cellar attic bedroom garage".split()
OBJECTS = "key cup book ball coin lamp hat map ring box pen bag".split()
# (singular, plural) nouns for agreement sentences.
NOUNS = [
    ("man", "men"), ("woman", "women"), ("child", "children"), ("key", "keys"),
    ("door", "doors"), ("dog", "dogs"), ("box", "boxes"), ("book", "books"),
    ("girl", "girls"), ("boy", "boys"), ("teacher", "teachers"), ("bird", "birds"),
    ("chair", "chairs"), ("farmer", "farmers"), ("horse", "horses"), ("window", "windows"),
    ("doctor", "doctors"), ("table", "tables"), ("cat", "cats"), ("singer", "singers"),
]
# (third person singular, plural) transitive verbs used inside relative clauses.
VERBS = [
    ("holds", "hold"), ("sees", "see"), ("likes", "like"), ("finds", "find"),
    ("carries", "carry"), ("watches", "watch"), ("paints", "paint"), ("visits", "visit"),
]
ADJECTIVES = "old new small big red quiet happy tired clean broken heavy bright".split()
PREPOSITIONS = ("near", "behind", "with", "beside")

NUMBER_WORDS = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
    "fifteen sixteen seventeen eighteen nineteen twenty"
).split()
MAX_OPERAND = 12


def number_word(value: int) -> str:
    """English words for 0..99 ("twenty four")."""
    if value <= 20:
        return NUMBER_WORDS[value]
    tens = ("", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety")
    word = tens[value // 10]
    return word if value % 10 == 0 else f"{word} {NUMBER_WORDS[value % 10]}"


def _stable_hash(text: str) -> int:
    return zlib.crc32(text.encode())


def is_reserved_agreement_pair(head: str, attractor: str) -> bool:
    """(head noun, attractor noun) pairs kept out of training, used only by evaluation items."""
    return _stable_hash(f"agr:{head}:{attractor}") % 5 == 0


def is_training_sum(op: str, a: int, b: int) -> bool:
    """Ordered arithmetic problems that training text uses (about 1 in 5); items use the rest."""
    return _stable_hash(f"sum:{op}:{a}:{b}") % 5 == 0


@dataclass(frozen=True)
class Person:
    first: str
    last: str
    female: bool
    city: str
    job: str
    colour: str
    pet: str
    food: str
    game: str
    month: str
    sibling: str | None = None

    @property
    def name(self) -> str:
        return f"{self.first} {self.last}"


def build_world(seed: int = WORLD_SEED, num_people: int = NUM_PEOPLE) -> tuple[Person, ...]:
    """The fixed population: unique names, facts and sibling pairs (same surname)."""
    rng = random.Random(seed)
    firsts = [(name, True) for name in FEMALE_NAMES] + [(name, False) for name in MALE_NAMES]
    pairs = [(first, female, last) for (first, female), last in itertools.product(firsts, SURNAMES)]
    chosen = rng.sample(pairs, num_people)
    facts = []
    for first, female, last in chosen:
        facts.append(dict(
            first=first, last=last, female=female, city=rng.choice(CITIES),
            job=rng.choice(JOBS), colour=rng.choice(COLOURS), pet=rng.choice(PETS),
            food=rng.choice(FOODS), game=rng.choice(GAMES), month=rng.choice(MONTHS),
        ))
    by_surname = collections.defaultdict(list)
    for index, fact in enumerate(facts):
        by_surname[fact["last"]].append(index)
    for members in by_surname.values():
        rng.shuffle(members)
        for i, j in zip(members[0::2], members[1::2]):
            facts[i]["sibling"] = f"{facts[j]['first']} {facts[j]['last']}"
            facts[j]["sibling"] = f"{facts[i]['first']} {facts[i]['last']}"
    return tuple(Person(**fact) for fact in facts)


WORLD = build_world()
PEOPLE_BY_NAME = {person.name: person for person in WORLD}
FEMALE_SET = frozenset(FEMALE_NAMES)


def pronouns(female: bool) -> tuple[str, str]:
    """(subject, possessive) pronouns, lower case."""
    return ("she", "her") if female else ("he", "his")


def _cap(text: str) -> str:
    return text[0].upper() + text[1:]


# ---------------------------------------------------------------- sentence families
def fact_sentence(person: Person, attribute: str, use_name: bool) -> str:
    """One fact about ``person``, naming them in full or referring by pronoun."""
    p = person
    subject_pronoun, possessive_pronoun = pronouns(p.female)
    subject = p.name if use_name else _cap(subject_pronoun)
    if attribute == "city":
        return f"{subject} lives in {p.city}."
    if attribute == "job":
        return f"{subject} works as a {p.job}."
    if attribute == "pet":
        return f"{subject} has a pet {p.pet}."
    if attribute == "food":
        return f"{subject} loves to eat {p.food}."
    if attribute == "game":
        return f"{subject} plays {p.game} in the evenings."
    if attribute == "month":
        return f"{subject} was born in {p.month}."
    if attribute == "colour":
        if use_name:
            return f"The favourite colour of {p.name} is {p.colour}."
        return f"{_cap(possessive_pronoun)} favourite colour is {p.colour}."
    if attribute == "sibling":
        kin = "sister" if PEOPLE_BY_NAME[p.sibling].female else "brother"
        if use_name:
            return f"The {kin} of {p.name} is {p.sibling}."
        return f"{_cap(possessive_pronoun)} {kin} is {p.sibling}."
    raise ValueError(attribute)


ATTRIBUTES = ("city", "job", "colour", "pet", "food", "game", "month", "sibling")


def biography(rng: random.Random) -> list[str]:
    """3-6 facts about one person; the first names them, later ones mix pronouns and name."""
    person = rng.choice(WORLD)
    attributes = [a for a in ATTRIBUTES if a != "sibling" or person.sibling]
    chosen = rng.sample(attributes, rng.randint(3, min(6, len(attributes))))
    return [
        fact_sentence(person, attribute, use_name=position == 0 or rng.random() < 0.3)
        for position, attribute in enumerate(chosen)
    ]


def fact_summary(rng: random.Random) -> list[str]:
    """Compact two-fact sentences about one or two people."""
    sentences = []
    for _ in range(rng.randint(1, 2)):
        p = rng.choice(WORLD)
        form = rng.randrange(3)
        if form == 0:
            sentences.append(f"{p.name} lives in {p.city} and works as a {p.job}.")
        elif form == 1:
            sentences.append(f"{p.name} has a pet {p.pet} and loves to eat {p.food}.")
        else:
            sentences.append(f"{p.name} works as a {p.job} and plays {p.game}.")
    return sentences


def agreement_subject(rng: random.Random, train: bool) -> tuple[str, bool]:
    """A subject noun phrase with attractors; returns (phrase, head_is_plural).

    ``train=True`` avoids reserved (head, first attractor) pairs; ``train=False`` only uses them.
    """
    while True:
        head_index, attractor_index = rng.randrange(len(NOUNS)), rng.randrange(len(NOUNS))
        if head_index == attractor_index:
            continue
        head = NOUNS[head_index][0]
        attractor = NOUNS[attractor_index][0]
        if is_reserved_agreement_pair(head, attractor) != train:
            break
    head_plural, attractor_plural = rng.random() < 0.5, rng.random() < 0.5
    head_word = NOUNS[head_index][head_plural]
    attractor_word = NOUNS[attractor_index][attractor_plural]
    form = rng.randrange(4)
    if form == 0:  # The keys near the man
        phrase = f"the {head_word} {rng.choice(PREPOSITIONS)} the {attractor_word}"
    elif form == 1:  # The keys that the man holds
        verb = rng.choice(VERBS)[attractor_plural]
        phrase = f"the {head_word} that the {attractor_word} {verb}"
    else:  # The keys that the man near the doors holds
        inner_plural = rng.random() < 0.5
        inner = NOUNS[rng.randrange(len(NOUNS))][inner_plural]
        verb = rng.choice(VERBS)[attractor_plural]
        if form == 2:
            phrase = (f"the {head_word} that the {attractor_word} "
                      f"{rng.choice(PREPOSITIONS)} the {inner} {verb}")
        else:  # The keys near the man that the dogs see
            inner_verb = rng.choice(VERBS)[inner_plural]
            phrase = (f"the {head_word} {rng.choice(PREPOSITIONS)} the {attractor_word} "
                      f"that the {inner} {inner_verb}")
    return phrase, head_plural


def agreement_verb(plural: bool, past: bool) -> str:
    if past:
        return "were" if plural else "was"
    return "are" if plural else "is"


def agreement(rng: random.Random) -> list[str]:
    """2-4 sentences whose main verb agrees with a head noun across attractors."""
    sentences = []
    for _ in range(rng.randint(2, 4)):
        phrase, plural = agreement_subject(rng, train=True)
        verb = agreement_verb(plural, past=rng.random() < 0.4)
        sentences.append(f"{_cap(phrase)} {verb} {rng.choice(ADJECTIVES)}.")
    return sentences


class Story:
    """State of an entity-tracking story: who holds which object, who is in which room."""

    def __init__(self, rng: random.Random, num_people: int | None = None,
                 num_objects: int | None = None):
        self.rng = rng
        count = num_people or rng.randint(2, 3)
        self.people = rng.sample(FEMALE_NAMES + MALE_NAMES, count)
        self.objects = rng.sample(OBJECTS, num_objects or rng.randint(1, 2))
        self.holder: dict[str, str | None] = {obj: None for obj in self.objects}
        self.previous_holders: dict[str, list[str]] = {obj: [] for obj in self.objects}
        self.room = {person: rng.choice(ROOMS) for person in self.people}
        self.object_room = {obj: rng.choice(ROOMS) for obj in self.objects}

    def opening(self) -> str:
        rooms = ", ".join(f"{p} is in the {self.room[p]}" for p in self.people)
        return _cap(rooms) + "."

    def step(self) -> str:
        """Apply one random event and return its sentence."""
        rng = self.rng
        obj = rng.choice(self.objects)
        holder = self.holder[obj]
        actor = rng.choice(self.people)
        subject = "she" if actor in FEMALE_SET else "he"
        if holder is None:
            self._take(obj, actor)
            self.room[actor] = self.object_room[obj]
            return f"{actor} finds the {obj} in the {self.room[actor]} and picks it up."
        if rng.random() < 0.55:
            receiver = rng.choice([p for p in self.people if p != holder])
            self._take(obj, receiver)
            self.room[receiver] = self.room[holder]
            return f"{holder} gives the {obj} to {receiver}."
        if rng.random() < 0.5:
            room = rng.choice([r for r in ROOMS if r != self.room[holder]])
            self.room[holder] = room
            holder_subject = "she" if holder in FEMALE_SET else "he"
            return f"{holder} takes the {obj} and then {holder_subject} goes to the {room}."
        if actor != holder:
            room = rng.choice(ROOMS)
            self.room[actor] = room
            return f"{actor} goes to the {room} and {subject} waits there."
        self.object_room[obj] = self.room[holder]
        self.previous_holders[obj].append(holder)
        self.holder[obj] = None
        return f"{holder} drops the {obj} in the {self.room[holder]}."

    def _take(self, obj: str, person: str) -> None:
        if self.holder[obj] is not None:
            self.previous_holders[obj].append(self.holder[obj])
        self.holder[obj] = person

    def status(self, obj: str) -> str:
        holder = self.holder[obj]
        if holder is None:
            return f"Now the {obj} is in the {self.object_room[obj]}."
        return f"Now the {obj} is with {holder}."


def story(rng: random.Random) -> list[str]:
    """An entity-tracking story with interleaved status sentences."""
    state = Story(rng)
    sentences = [state.opening()]
    for _ in range(rng.randint(3, 8)):
        sentences.append(state.step())
        if rng.random() < 0.35:
            sentences.append(state.status(rng.choice(state.objects)))
    sentences.append(state.status(rng.choice(state.objects)))
    return sentences


def arithmetic_problem(rng: random.Random, train: bool) -> tuple[str, int]:
    """("seven plus five", 12): from the training problems if ``train``, else from the rest."""
    while True:
        op = "plus" if rng.random() < 0.6 else "minus"
        a, b = rng.randint(0, MAX_OPERAND), rng.randint(0, MAX_OPERAND)
        if op == "minus" and b > a:
            a, b = b, a
        if is_training_sum(op, a, b) != train:
            continue
        result = a + b if op == "plus" else a - b
        return f"{number_word(a)} {op} {number_word(b)}", result


def arithmetic(rng: random.Random) -> list[str]:
    """One sentence listing 2-5 sums."""
    name = rng.choice(FEMALE_NAMES + MALE_NAMES)
    parts = []
    for _ in range(rng.randint(2, 5)):
        problem, result = arithmetic_problem(rng, train=True)
        parts.append(f"{problem} is {number_word(result)}")
    return [f"{name} did some sums: " + ", ".join(parts) + "."]


SEGMENTS = (
    (biography, 0.40), (fact_summary, 0.15), (story, 0.20), (agreement, 0.13), (arithmetic, 0.12),
)
_SEGMENT_FUNCTIONS = [function for function, _ in SEGMENTS]
_SEGMENT_WEIGHTS = list(itertools.accumulate(weight for _, weight in SEGMENTS))


def document(split: str, index: int) -> str:
    """Document ``index`` of ``split``: one paragraph of 3-6 segments."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
    rng = random.Random(f"{CORPUS_VERSION}:{split}:{index}")
    sentences: list[str] = []
    for _ in range(rng.randint(3, 6)):
        segment = rng.choices(_SEGMENT_FUNCTIONS, cum_weights=_SEGMENT_WEIGHTS)[0]
        sentences.extend(segment(rng))
    return " ".join(sentences)


def documents(split: str, n: int) -> list[str]:
    """The first ``n`` documents of ``split`` (deterministic on every machine)."""
    return [document(split, index) for index in range(n)]


def iter_documents(split: str, start: int = 0) -> Iterator[str]:
    """Endless deterministic stream of ``split`` documents, from document ``start`` on."""
    for index in itertools.count(start):
        yield document(split, index)


def unigram_perplexity(tokenizer, split: str = "test", n: int = 2000,
                       train_n: int = 20000) -> float:
    """exp(cross-entropy) of ``split`` tokens under the add-one unigram model of the train split.

    ``tokenizer`` is a ``transformers`` tokenizer or a ``tokenizers.Tokenizer``. This is the
    baseline a model must beat: it knows token frequencies but nothing about context.
    """
    counts = collections.Counter()
    for ids in _encode_batch(tokenizer, documents("train", train_n)):
        counts.update(ids)
    vocab_size = len(tokenizer.get_vocab()) if hasattr(tokenizer, "get_vocab") else len(tokenizer)
    total = sum(counts.values()) + vocab_size
    negative_log_likelihood, num_tokens = 0.0, 0
    for ids in _encode_batch(tokenizer, documents(split, n)):
        for token in ids:
            negative_log_likelihood -= math.log((counts[token] + 1) / total)
        num_tokens += len(ids)
    return math.exp(negative_log_likelihood / num_tokens)


def _encode_batch(tokenizer, texts: list[str]) -> list[list[int]]:
    if hasattr(tokenizer, "encode_batch"):  # tokenizers.Tokenizer
        return [encoding.ids for encoding in tokenizer.encode_batch(texts)]
    return tokenizer(texts, add_special_tokens=False)["input_ids"]
