"""Held-out probes and labelled downstream tasks over the built-in corpus's World.

A probe is a cloze: text with one "[MASK]" word, the answer and the candidates to rank
(tokenizer-agnostic: the scorer substitutes its own mask). Tasks come as train /
validation / test splits of plain records.
"""
from __future__ import annotations

import random

from lmforge.data.synthetic import BAD, GOOD, NOUNS, PLACES, PREDICATES, article, biography, review
from lmforge.data.world import OCCUPATIONS, World

MASK = "[MASK]"


def _probe(kind: str, text: str, answer: str, candidates: list) -> dict:
    return {"kind": kind, "text": text, "answer": answer, "candidates": sorted(set(candidates) | {answer})}


def fact_probe(w: World, rng: random.Random) -> dict:
    """Where was X born? (the fact is stated in X's biography)."""
    p = rng.choice(w.people)
    return _probe("fact", f"{p.name} was born in {MASK}.", p.city, [c.name for c in w.cities])


def pronoun_probe(w: World, rng: random.Random) -> dict:
    """He or she, referring back to the person just named."""
    p = rng.choice(w.people)
    return _probe("pronoun", f"{p.name} was born in {p.city} in {p.year}. {MASK} works as {article(p.occupation)} {p.occupation}.",
                  p.pronoun.capitalize(), ["He", "She"])


def agreement_probe(rng: random.Random) -> dict:
    """is / are agreeing with the subject, not with the attractor."""
    (one, many), place = rng.choice(NOUNS), rng.choice(PLACES)
    plural = rng.random() < 0.5
    attractor = place if plural else place + "s"
    return _probe("agreement", f"The {many if plural else one} near the {attractor} {MASK} {rng.choice(PREDICATES)}.",
                  "are" if plural else "is", ["is", "are"])


def sentiment_probe(w: World, rng: random.Random) -> dict:
    """A sentiment word consistent with the product's quality."""
    p = rng.choice(w.products)
    answer = rng.choice(GOOD if p.good else BAD)
    return _probe("sentiment", f"I bought the {p.maker} {p.name} {p.kind} last week. It is {MASK}.", answer,
                  [rng.choice(BAD if p.good else GOOD)])


def number_probe(rng: random.Random) -> dict:
    """The next term of an arithmetic sequence."""
    start, step = rng.randint(0, 50), rng.randint(1, 9)
    seen = ", ".join(str(start + k * step) for k in range(4))
    answer = start + 4 * step
    return _probe("number", f"The sequence goes {seen}, {MASK}.", str(answer),
                  [str(answer + d) for d in (-2, -1, 1, 2)])


def probes(n_per_kind: int = 50, seed: int = 0, world: World | None = None) -> list:
    """Cloze probes of every kind, deterministic from `seed` (a different stream from the corpus)."""
    w = world or World(seed)
    rng = random.Random(seed + 7)
    out = []
    for _ in range(n_per_kind):
        out += [fact_probe(w, rng), pronoun_probe(w, rng), agreement_probe(rng), sentiment_probe(w, rng),
                number_probe(rng)]
    return out


def _split(records: list, rng: random.Random) -> dict:
    rng.shuffle(records)
    n = len(records)
    return {"train": records[: int(0.8 * n)], "validation": records[int(0.8 * n): int(0.9 * n)],
            "test": records[int(0.9 * n):]}


def sentiment_task(w: World, n: int, rng: random.Random) -> dict:
    """Review text -> 1 (positive) / 0 (negative)."""
    records = []
    for _ in range(n):
        sentences, label = review(w, rng.randrange(len(w.products)), rng)
        records.append({"text": " ".join(sentences[:1] + sentences[2:]) if rng.random() < 0.3
                        else " ".join(sentences), "label": label})
    return _split(records, rng)


def entailment_task(w: World, n: int, rng: random.Random) -> dict:
    """(premise biography, hypothesis fact) -> 1 entailed / 0 contradicted."""
    records = []
    for _ in range(n):
        i = rng.randrange(len(w.people))
        p, true = w.people[i], rng.random() < 0.5
        field = rng.choice(["city", "occupation", "year"])
        if field == "city":
            value = p.city if true else rng.choice([c.name for c in w.cities if c.name != p.city])
            hypothesis = f"{p.name} was born in {value}."
        elif field == "occupation":
            value = p.occupation if true else rng.choice([o for o in OCCUPATIONS if o != p.occupation])
            hypothesis = f"{p.name} works as {article(value)} {value}."
        else:
            hypothesis = f"{p.name} was born in {p.year if true else p.year + rng.choice([-3, -1, 2, 5])}."
        records.append({"premise": " ".join(biography(w, i, rng)), "hypothesis": hypothesis, "label": int(true)})
    return _split(records, rng)


def tagging_task(w: World, n: int, rng: random.Random) -> dict:
    """Words of a biography sentence with BIO tags for PER, LOC and DATE."""
    records = []
    for _ in range(n):
        p = rng.choice(w.people)
        words = [*p.name.split(), "was", "born", "in", p.city, "in", str(p.year), "."]
        tags = ["B-PER", "I-PER", "O", "O", "O", "B-LOC", "O", "B-DATE", "O"]
        records.append({"words": words, "tags": tags})
    return _split(records, rng)


def questions_task(w: World, n: int, rng: random.Random) -> dict:
    """(question, biography context) -> the answer span (text and character start)."""
    records = []
    for _ in range(n):
        i = rng.randrange(len(w.people))
        p = w.people[i]
        context = " ".join(biography(w, i, rng))
        question, answer = rng.choice([(f"Where was {p.name} born?", p.city),
                                       (f"When was {p.name} born?", str(p.year)),
                                       (f"What does {p.name} work as?", p.occupation)])
        # the answer's first occurrence is the one the biography states (names never contain it)
        records.append({"question": question, "context": context, "answer": answer,
                        "start": context.index(answer)})
    return _split(records, rng)


TASKS = {"sentiment": sentiment_task, "entailment": entailment_task, "tagging": tagging_task,
         "questions": questions_task}


def tasks(n: int = 1000, seed: int = 0, world: World | None = None) -> dict:
    """Every labelled task with `n` records, split 80/10/10, deterministic from `seed`."""
    w = world or World(seed)
    return {name: make(w, n, random.Random(seed + 11 + k)) for k, (name, make) in enumerate(TASKS.items())}
