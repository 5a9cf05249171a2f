import re

from lmforge.data import World, corpus_text, documents, probes, tasks, write_corpus


def test_same_seed_same_text_other_seed_other_text():
    assert corpus_text(50, seed=3) == corpus_text(50, seed=3)
    assert corpus_text(50, seed=3) != corpus_text(50, seed=4)


def test_biographies_state_the_worlds_facts_with_agreeing_pronouns():
    world = World(0)
    people = {p.name: p for p in world.people}
    seen = 0
    for doc in documents(300, seed=0, world=world):
        first = re.fullmatch(r"(\w+ \w+) was born in (\w+) in (\d+)\.", doc[0])
        if not first or first.group(1) not in people:
            continue
        p = people[first.group(1)]
        assert (first.group(2), int(first.group(3))) == (p.city, p.year)
        for sentence in doc[1:]:
            if " works as " in sentence:
                assert sentence.startswith(p.pronoun.capitalize()) and sentence.endswith(f"{p.occupation}.")
            if sentence.endswith(f"in {world.city(p.city).country}."):
                assert sentence.startswith(p.city)
        seen += 1
    assert seen > 50


def test_reviews_agree_with_product_quality_and_agreement_sentences_agree():
    from lmforge.data.synthetic import BAD, GOOD

    world = World(0)
    for doc in documents(400, seed=0, world=world):
        if doc[0].startswith("I bought the"):
            product = next(p for p in world.products if f" {p.name} {p.kind}" in doc[0])
            assert doc[1][6:-1] in (GOOD if product.good else BAD)
        for s in doc:
            m = re.fullmatch(r"The (\w+) near the \w+ (is|are) .*\.", s)
            if m:
                assert (m.group(2) == "are") == (m.group(1).endswith("s") or m.group(1) == "children")


def test_probe_answers_follow_from_the_world():
    world = World(0)
    people = {p.name: p for p in world.people}
    out = probes(20, seed=0, world=world)
    assert {p["kind"] for p in out} == {"fact", "pronoun", "agreement", "sentiment", "number", "copy",
                                        "coreference", "tone"}
    for p in out:
        assert p["text"].count("[MASK]") == 1 and p["answer"] in p["candidates"]
        if p["kind"] == "fact":
            assert people[p["text"].split(" was")[0]].city == p["answer"]
        if p["kind"] == "number":
            terms = [int(x) for x in re.findall(r"\d+", p["text"])]
            assert int(p["answer"]) - terms[-1] == terms[1] - terms[0]


def test_tasks_are_split_and_consistent():
    out = tasks(200, seed=1)
    for name, split in out.items():
        assert [len(split[k]) for k in ("train", "validation", "test")] == [160, 20, 20], name
    for r in out["questions"]["train"]:
        assert r["context"][r["start"]:r["start"] + len(r["answer"])] == r["answer"]
    for r in out["tagging"]["train"]:
        assert len(r["words"]) == len(r["tags"])
    labels = [r["label"] for r in out["sentiment"]["train"] + out["entailment"]["train"]]
    assert 0.3 < sum(labels) / len(labels) < 0.7


def test_write_corpus_reaches_the_requested_size(tmp_path):
    path = write_corpus(tmp_path / "c.txt", 20_000, seed=0)
    text = path.read_text(encoding="utf-8")
    assert 20_000 <= len(text.encode()) < 21_000 and "\n\n" in text


def test_the_built_in_data_refuses_counts_and_seeds_it_cannot_draw_naming_them():
    """documents and tasks check n and seed when called (a generator would wait for the first document):
    True was read as 1 document, -1 as none, and 2.5 or None failed inside random; numpy's and whole
    floats' values are read as Python's."""
    import numpy as np
    import pytest

    from lmforge.config.options import OptionsError

    for call, field in ((lambda: documents(True), "n"), (lambda: documents(-1), "n"),
                        (lambda: documents(2.5), "n"), (lambda: documents(2, seed=None), "seed"),
                        (lambda: tasks(n=True), "n"), (lambda: tasks(seed=2.5), "seed")):
        with pytest.raises(OptionsError) as refused:
            call()
        assert refused.value.field == field
    assert list(documents(np.int64(3), seed=np.int64(1))) == list(documents(3.0, seed=1))
