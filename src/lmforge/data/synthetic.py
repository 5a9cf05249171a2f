"""The built-in corpus: English-like documents about a synthetic World, of any size, from a seed.

Five kinds of document — biographies (facts and pronoun coreference), city notes,
product reviews (a sentiment decided by the product's quality), number sequences and
sentences with subject-verb agreement across an attractor. Held-out probes
(lmforge.data.probes) ask what pretraining should have learnt: facts about the World
(a birth city, a pronoun, a sentiment word) and patterns applied in context (an agreement,
the next number, a restated city, a pronoun, a review's tone); labelled tasks serve
fine-tuning (sentiment, fact entailment, entity tagging, span questions). Same seed,
same text.
"""
from __future__ import annotations

import random
from pathlib import Path

from lmforge.config.options import checked_argument, checked_seed
from lmforge.data.world import World
from lmforge.utils.atomic import atomic_write

GOOD = ["excellent", "wonderful", "great", "reliable", "superb"]
BAD = ["terrible", "awful", "useless", "disappointing", "flimsy"]
GOOD_MORE = ["I use it every day.", "It works perfectly.", "I would buy it again.", "My family loves it."]
BAD_MORE = ["It broke after a week.", "I want my money back.", "It stopped working.", "Nobody likes it."]
NOUNS = [("dog", "dogs"), ("key", "keys"), ("teacher", "teachers"), ("boat", "boats"), ("child", "children"),
         ("lamp", "lamps"), ("farmer", "farmers"), ("bird", "birds")]
PLACES = ["bridge", "cabinet", "river", "market", "garden", "station"]
PREDICATES = ["old", "quiet", "ready", "here", "near the door", "very small"]
KINDS = ("biography", "city", "review", "numbers", "agreement")


def article(word: str) -> str:
    """'a' or 'an' before `word`."""
    return "an" if word[0] in "aeiou" else "a"


def biography(w: World, i: int, rng: random.Random) -> list:
    """Sentences about person i; the pronouns refer back to them."""
    p, s = w.people[i], w.people[w.people[i].sibling]
    city = w.city(p.city)
    facts = [f"{p.pronoun.capitalize()} works as {article(p.occupation)} {p.occupation}.",
             f"{p.possessive.capitalize()} {'sister' if s.female else 'brother'} is {s.name}."
             if s is not p else f"{p.pronoun.capitalize()} has no siblings.",
             f"{p.city} is a city in {city.country}."]
    rng.shuffle(facts)
    return [f"{p.name} was born in {p.city} in {p.year}.", *facts]


def city_note(w: World, i: int, rng: random.Random) -> list:
    """Sentences about city i."""
    c = w.cities[i]
    born = [p for p in w.people if p.city == c.name]
    out = [f"{c.name} lies on the {c.river} river.", f"It is a city in {c.country}."]
    if born:
        out.append(f"{rng.choice(born).name} was born in {c.name}.")
    return out


def review(w: World, i: int, rng: random.Random) -> tuple:
    """(sentences, sentiment 1/0) of a review of product i."""
    p = w.products[i]
    words, more = (GOOD, GOOD_MORE) if p.good else (BAD, BAD_MORE)
    when = rng.choice(["last week", "in May", "for my brother", "online", "last year"])
    return [f"I bought the {p.maker} {p.name} {p.kind} {when}.", f"It is {rng.choice(words)}.",
            rng.choice(more)], int(p.good)


def numbers(rng: random.Random, length: int = 6) -> list:
    """An arithmetic sequence written out."""
    start, step = rng.randint(0, 50), rng.randint(1, 9)
    return ["The sequence goes " + ", ".join(str(start + k * step) for k in range(length)) + "."]


def agreement(rng: random.Random) -> list:
    """A subject, a prepositional attractor of the other number, and the agreeing verb."""
    (one, many), place = rng.choice(NOUNS), rng.choice(PLACES)
    plural = rng.random() < 0.5
    attractor = "the " + (place if plural else place + "s")
    return [f"The {many if plural else one} near {attractor} {'are' if plural else 'is'} "
            f"{rng.choice(PREDICATES)}."]


def document(w: World, rng: random.Random) -> list:
    """One document (a list of sentences) of a random kind."""
    kind = rng.choices(KINDS, weights=(4, 1, 3, 1, 1))[0]
    if kind == "biography":
        return biography(w, rng.randrange(len(w.people)), rng)
    if kind == "city":
        return city_note(w, rng.randrange(len(w.cities)), rng)
    if kind == "review":
        return review(w, rng.randrange(len(w.products)), rng)[0]
    return [s for _ in range(rng.randint(2, 4))
            for s in (numbers(rng) if kind == "numbers" else agreement(rng))]


def built_in_counts(n, seed, most: int | None = None) -> tuple:
    """(n, seed) as the built-in data reads them: a whole count from 0 (to `most`, where the records are
    all held at once) and a seed of TrainConfig's range; an OptionsError naming either (True is no count,
    and random takes no float)."""
    return (checked_argument("n", "int", {"low": 0, "high": most}, n),
            checked_seed(seed))


def documents(n: int, seed: int = 0, world: World | None = None):
    """`n` documents, each a list of sentences, deterministic from `seed`."""
    n, seed = built_in_counts(n, seed)  # checked at the call, not at the first document drawn (streamed)
    return _documents(n, seed, world or World(seed))


def _documents(n: int, seed: int, w: World):
    rng = random.Random(seed + 1)
    for _ in range(n):
        yield document(w, rng)


def corpus_text(n_docs: int, seed: int = 0) -> str:
    """The corpus as plain text: one sentence per line, documents separated by a blank line."""
    return "\n\n".join("\n".join(doc) for doc in documents(n_docs, seed)) + "\n"


def write_corpus(path, n_bytes: int, seed: int = 0) -> Path:
    """Write at least `n_bytes` of corpus text to `path` (streamed: any size)."""
    def write(handle) -> None:
        written = 0
        for doc in documents(10 ** 12, seed):
            text = ("\n".join(doc) + "\n\n").encode("utf-8")
            handle.write(text)
            written += len(text)
            if written >= n_bytes:
                break

    return atomic_write(Path(path), write)
