"""A small synthetic world with consistent facts: the built-in corpus's subject matter.

People (name, pronoun, birth city, birth year, occupation, sibling), cities (country,
river), products (kind, maker, quality). Everything derives from one seed, so the same
seed always describes the same world, and facts stated in the corpus can be asked about
in probes and downstream tasks.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

ONSETS = ["b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "tr", "st", "kl", "dr"]
VOWELS = ["a", "e", "i", "o", "u", "ai", "ea", "ou"]
CODAS = ["", "", "n", "r", "l", "s", "th", "m", "nd"]
OCCUPATIONS = ["baker", "teacher", "farmer", "doctor", "painter", "sailor", "engineer", "writer", "singer",
               "lawyer", "gardener", "pilot"]
KINDS = ["kettle", "lamp", "bicycle", "camera", "chair", "phone", "jacket", "blender", "tent", "watch"]


def coin_name(rng: random.Random, syllables: int) -> str:
    """A pronounceable made-up word, capitalised."""
    word = "".join(rng.choice(ONSETS) + rng.choice(VOWELS) for _ in range(syllables)) + rng.choice(CODAS)
    return word.capitalize()


@dataclass(frozen=True)
class City:
    """A city, the country it lies in and its river."""

    name: str
    country: str
    river: str


@dataclass(frozen=True)
class Person:
    """A person and the facts the corpus states about them."""

    first: str
    last: str
    female: bool
    city: str  # birth city
    year: int  # birth year
    occupation: str
    sibling: int  # index of a sibling in World.people (same family name)

    @property
    def name(self) -> str:
        """First and family name."""
        return f"{self.first} {self.last}"

    @property
    def pronoun(self) -> str:
        """Subject pronoun."""
        return "she" if self.female else "he"

    @property
    def possessive(self) -> str:
        """Possessive determiner."""
        return "her" if self.female else "his"


@dataclass(frozen=True)
class Product:
    """A product with a maker and a quality that decides the sentiment of its reviews."""

    name: str
    kind: str
    maker: str
    good: bool


def _unique(rng: random.Random, n: int, syllables: tuple, taken: set) -> list:
    out = []
    while len(out) < n:
        word = coin_name(rng, rng.choice(syllables))
        if word not in taken:
            taken.add(word)
            out.append(word)
    return out


class World:
    """Entities and facts drawn from `seed`; sizes scale the number of distinct facts."""

    def __init__(self, seed: int = 0, n_people: int = 120, n_cities: int = 24, n_products: int = 40) -> None:
        rng = random.Random(seed)
        taken: set = set()
        countries = _unique(rng, max(2, n_cities // 6), (2, 3), taken)
        rivers = _unique(rng, n_cities, (2,), taken)
        self.cities = [City(name, rng.choice(countries), river)
                       for name, river in zip(_unique(rng, n_cities, (2, 3), taken), rivers)]
        self.countries = countries
        firsts = _unique(rng, n_people, (2, 3), taken)
        families = _unique(rng, max(1, n_people // 2), (2, 3), taken)
        self.people = []
        for i, first in enumerate(firsts):
            family = i // 2  # people 2k and 2k+1 are siblings
            self.people.append(Person(first, families[family % len(families)], rng.random() < 0.5,
                                      rng.choice(self.cities).name, rng.randint(1920, 2005),
                                      rng.choice(OCCUPATIONS), i ^ 1 if (i ^ 1) < n_people else i))
        makers = _unique(rng, max(2, n_products // 5), (2,), taken)
        self.products = [Product(name, rng.choice(KINDS), rng.choice(makers), rng.random() < 0.5)
                         for name in _unique(rng, n_products, (2, 3), taken)]

    def city(self, name: str) -> City:
        """The city called `name`."""
        return next(c for c in self.cities if c.name == name)
