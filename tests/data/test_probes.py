import re

import pytest

from lmforge.data import World, documents, probes
from lmforge.data.probes import GROUPS, MASK
from lmforge.data.synthetic import BAD, BAD_MORE, GOOD, GOOD_MORE

CONTEXT = ("agreement", "number", "copy", "coreference", "tone")


def test_golden_probes_for_seed_0():
    first = {p["kind"]: p for p in reversed(probes(3, seed=0))}
    assert first["copy"] == {
        "kind": "copy", "group": "context", "answer": "Goutrais",
        "text": "Faisaim Fepoufal was born in Goutrais in 2002. [MASK] is a city in Teasond.",
        "candidates": sorted(c.name for c in World(0).cities)}
    assert first["coreference"]["text"] == ("Trelouvun Reatabrain was born in Tatrouzaind in 1990. He works "
                                            "as a lawyer. [MASK] sister is Mukoth Reatabrain.")
    assert (first["coreference"]["answer"], first["coreference"]["candidates"]) == ("His", ["Her", "His"])
    assert first["tone"]["text"] == "I bought the Vufir Nifikor kettle last week. It is [MASK]. " \
        "My family loves it."
    assert first["fact"]["text"] == "Kotror Vuneas was born in [MASK]." and first["fact"]["answer"] == "Mupi"


def test_answers_are_balanced_so_a_fixed_preference_scores_chance():
    out = probes(48, seed=2)  # 48: whole rounds of the 24 cities and of the two-way answers
    prior = {word: float(len(word) % 7) for p in out for word in p["candidates"]}  # any text-blind preference
    for kind in ("fact", "pronoun", "agreement", "copy", "coreference"):
        margins = [prior[p["answer"]] - sum(prior[c] for c in p["candidates"] if c != p["answer"])
                   / (len(p["candidates"]) - 1) for p in out if p["kind"] == kind]
        assert sum(margins) == pytest.approx(0, abs=1e-9), kind
    for kind in ("sentiment", "tone"):  # the two words are drawn at random: balanced polarity, not words
        assert sum(p["answer"] in GOOD for p in out if p["kind"] == kind) == 24


def test_probes_are_deterministic_and_cover_every_kind_once_per_round():
    assert probes(4, seed=3) == probes(4, seed=3) != probes(4, seed=4)
    out = probes(4, seed=3)
    assert len(out) == 4 * len(GROUPS) and [p["kind"] for p in out[:len(GROUPS)]] == list(GROUPS)
    assert {GROUPS[k] for k in CONTEXT} == {"context"} and set(GROUPS.values()) == {"context", "memory"}
    for p in out:
        assert p["group"] == GROUPS[p["kind"]] and p["text"].count(MASK) == 1
        assert p["answer"] in p["candidates"] and len(p["candidates"]) == len(set(p["candidates"])) >= 2


def test_context_probes_are_decided_by_their_own_text():
    for p in probes(30, seed=1):
        before, after = p["text"].split(MASK)
        if p["kind"] == "copy":  # the answer is the city the first sentence names, the only one it names
            assert [c for c in p["candidates"] if c in before] == [p["answer"]]
        if p["kind"] == "coreference":
            assert {"He ": "His", "She ": "Her"}[re.search(r"\. (He |She )", before).group(1)] == p["answer"]
        if p["kind"] == "tone":
            cue = after.removeprefix(". ")
            assert (p["answer"] in GOOD) == (cue in GOOD_MORE) != (cue in BAD_MORE)
            assert {p["answer"], *p["candidates"]} <= set(GOOD + BAD) and len(p["candidates"]) == 2
        if p["kind"] == "agreement":
            subject = before.split()[1]
            assert (p["answer"] == "are") == (subject.endswith("s") or subject == "children")


def test_context_probes_name_entities_the_corpus_never_mentions():
    world = World(0)
    corpus = " ".join(s for doc in documents(3000, seed=0, world=world) for s in doc)
    known = set(re.findall(r"[A-Z][a-z]+", corpus))
    for p in probes(20, seed=0, world=world):
        names = set(re.findall(r"[A-Z][a-z]+", p["text"].split(MASK)[0])) - {"I", "It", "He", "She", "The"}
        if p["kind"] in ("copy", "coreference"):  # the person is new; the city is a real one
            assert len(names - known) >= 2, p["text"]
        if p["kind"] == "tone":  # the product is new; the maker is a real one
            assert len(names - known) == 1, p["text"]
        if p["kind"] in ("fact", "pronoun", "sentiment"):
            assert names <= known


@pytest.mark.parametrize("seed", [0, 5])
def test_memory_probes_ask_what_the_world_states(seed):
    world = World(seed)
    people = {p.name: p for p in world.people}
    products = {p.name: p for p in world.products}
    for p in probes(10, seed=seed, world=world):
        if p["kind"] == "pronoun":
            person = people[p["text"].split(" was")[0]]
            assert p["answer"] == person.pronoun.capitalize()
        if p["kind"] == "sentiment":
            product = products[p["text"].split()[4]]
            assert (p["answer"] in GOOD) == product.good
