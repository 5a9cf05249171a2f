"""Held-out probes and labelled downstream tasks over the built-in corpus's World.

A probe is a cloze: text with one "[MASK]" word, the answer and the candidates to rank
(tokenizer-agnostic: the scorer substitutes its own mask). Probes come in two groups:

- "memory": a fact about one of the World's entities that the text does not state (where a
  person was born, their gender, a product's quality): right only if pretraining memorised
  it, so these need many passes over the corpus;
- "context": the cue is in the probe's own text, in a pattern the corpus teaches (verb
  agreement across an attractor, the next term of a sequence, a city restated, a pronoun
  agreeing with an earlier one, a review's sentiment word agreeing with its next sentence).
  Their people and products are new names, never in the World, so memory cannot help.

Tasks come as train / validation / test splits of plain records.
"""
from __future__ import annotations

import random

from lmforge.data.synthetic import (BAD, BAD_MORE, GOOD, GOOD_MORE, NOUNS, PLACES, PREDICATES, article,
                                    biography, built_in_counts, review)
from lmforge.data.world import KINDS as PRODUCT_KINDS
from lmforge.data.world import OCCUPATIONS, World, coin_name

MASK = "[MASK]"


def _probe(kind: str, text: str, answer: str, candidates: list) -> dict:
    return {"kind": kind, "group": GROUPS[kind], "text": text, "answer": answer,
            "candidates": sorted(set(candidates) | {answer})}


def birth_cities(w: World) -> list:
    """The cities someone in `w` was born in: the fact probe's candidates."""
    return sorted({p.city for p in w.people})


def fact_probe(w: World, rng: random.Random, city: str) -> dict:
    """Where was X born? (the fact is stated in X's biography): X is someone born in `city`."""
    p = rng.choice([p for p in w.people if p.city == city])
    return _probe("fact", f"{p.name} was born in {MASK}.", p.city, birth_cities(w))


def pronoun_probe(w: World, rng: random.Random, female: bool) -> dict:
    """He or she, referring back to the person just named (their gender is in the corpus only)."""
    p = rng.choice([p for p in w.people if p.female == female])
    text = (f"{p.name} was born in {p.city} in {p.year}. "
            f"{MASK} works as {article(p.occupation)} {p.occupation}.")
    return _probe("pronoun", text, p.pronoun.capitalize(), ["He", "She"])


def sentiment_probe(w: World, rng: random.Random, good: bool) -> dict:
    """A sentiment word consistent with the product's quality (known from its reviews only)."""
    p = rng.choice([p for p in w.products if p.good == good])
    answer = rng.choice(GOOD if p.good else BAD)
    return _probe("sentiment", f"I bought the {p.maker} {p.name} {p.kind} last week. It is {MASK}.", answer,
                  [rng.choice(BAD if p.good else GOOD)])


def agreement_probe(rng: random.Random, plural: bool) -> dict:
    """is / are agreeing with the subject, not with the attractor."""
    (one, many), place = rng.choice(NOUNS), rng.choice(PLACES)
    attractor = place if plural else place + "s"
    text = f"The {many if plural else one} near the {attractor} {MASK} {rng.choice(PREDICATES)}."
    return _probe("agreement", text, "are" if plural else "is", ["is", "are"])


def number_probe(rng: random.Random) -> dict:
    """The next term of an arithmetic sequence."""
    start, step = rng.randint(0, 50), rng.randint(1, 9)
    seen = ", ".join(str(start + k * step) for k in range(4))
    answer = start + 4 * step
    return _probe("number", f"The sequence goes {seen}, {MASK}.", str(answer),
                  [str(answer + d) for d in (-2, -1, 1, 2)])


def new_name(w: World, rng: random.Random) -> str:
    """A made-up word that names nothing in `w` (an entity the corpus never mentions)."""
    taken = {c.name for c in w.cities} | set(w.countries) | {c.river for c in w.cities}
    taken |= {p.first for p in w.people} | {p.last for p in w.people} | {p.name for p in w.products}
    taken |= {p.maker for p in w.products}
    word = coin_name(rng, rng.choice((2, 3)))
    while word in taken:
        word = coin_name(rng, rng.choice((2, 3)))
    return word


def copy_probe(w: World, rng: random.Random, city: str) -> dict:
    """A new person's birth city, restated the way a biography restates it."""
    country = w.city(city).country
    text = (f"{new_name(w, rng)} {new_name(w, rng)} was born in {city} in {rng.randint(1920, 2005)}. "
            f"{MASK} is a city in {country}.")
    return _probe("copy", text, city, [c.name for c in w.cities])


def coreference_probe(w: World, rng: random.Random, female: bool) -> dict:
    """His or her, agreeing with the pronoun an earlier sentence used for a new person."""
    last, occupation = new_name(w, rng), rng.choice(OCCUPATIONS)
    sibling = f"{'sister' if rng.random() < 0.5 else 'brother'} is {new_name(w, rng)} {last}"
    person = f"{new_name(w, rng)} {last} was born in {rng.choice(w.cities).name} in {rng.randint(1920, 2005)}"
    text = (f"{person}. {'She' if female else 'He'} works as {article(occupation)} {occupation}. "
            f"{MASK} {sibling}.")
    return _probe("coreference", text, "Her" if female else "His", ["Her", "His"])


def tone_probe(w: World, rng: random.Random, good: bool) -> dict:
    """A review's sentiment word for a new product, agreeing with the review's next sentence."""
    answer, other = rng.choice(GOOD if good else BAD), rng.choice(BAD if good else GOOD)
    product = f"{rng.choice(w.products).maker} {new_name(w, rng)} {rng.choice(PRODUCT_KINDS)}"
    text = f"I bought the {product} last week. It is {MASK}. {rng.choice(GOOD_MORE if good else BAD_MORE)}"
    return _probe("tone", text, answer, [other])


# what each kind of probe needs: a fact memorised in pretraining, or a pattern applied to its own text
GROUPS = {"fact": "memory", "pronoun": "memory", "sentiment": "memory", "agreement": "context",
          "number": "context", "copy": "context", "coreference": "context", "tone": "context"}


def balanced(values, n: int, rng: random.Random) -> list:
    """n draws from `values` in shuffled rounds: each value equally often (to within one)."""
    out: list = []
    while len(out) < n:
        out += rng.sample(list(values), len(values))
    return out[:n]


def probes(n_per_kind: int = 50, seed: int = 0, world: World | None = None) -> list:
    """Cloze probes of every kind, deterministic from `seed` (a different stream from the corpus).

    Each candidate is the answer about equally often, so a model that ignores the probe's
    text and ranks the candidates by a fixed preference (how often each word occurs, say)
    scores chance on average: what rises above chance was learnt from the entity or the context."""
    w, n = world or World(seed), n_per_kind
    rng = random.Random(seed + 7)
    a = {"fact": balanced(birth_cities(w), n, rng), "copy": balanced([c.name for c in w.cities], n, rng)}
    a |= {kind: balanced((False, True), n, rng)
          for kind in ("pronoun", "sentiment", "agreement", "coreference", "tone")}
    out = []
    for i in range(n):
        out += [fact_probe(w, rng, a["fact"][i]), pronoun_probe(w, rng, a["pronoun"][i]),
                sentiment_probe(w, rng, a["sentiment"][i]), agreement_probe(rng, a["agreement"][i]),
                number_probe(rng), copy_probe(w, rng, a["copy"][i]),
                coreference_probe(w, rng, a["coreference"][i]), tone_probe(w, rng, a["tone"][i])]
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
        records.append({"premise": " ".join(biography(w, i, rng)), "hypothesis": hypothesis,
                        "label": int(true)})
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
    n, seed = built_in_counts(n, seed, most=10 ** 7)  # every record held at once
    w = world or World(seed)
    return {name: make(w, n, random.Random(seed + 11 + k)) for k, (name, make) in enumerate(TASKS.items())}
