"""The built-in treebank: every sentence is a projective tree, the links say what the grammar did,
and the same seed gives the same sentences."""
import pytest

from lmforge.data.treebank import (INTRANSITIVE, NOUNS, PRONOUNS, TRANSITIVE, held_out_splits, is_projective,
                                   tree_error, treebank, treebank_splits)


@pytest.fixture(scope="module")
def bank():
    return treebank(400, seed=3)


def test_every_sentence_is_a_projective_tree_with_one_root(bank):
    for r in bank:
        n = len(r["words"])
        assert len(r["upos"]) == len(r["heads"]) == len(r["deprels"]) == n
        assert tree_error(r["heads"]) is None, r["words"]
        assert r["heads"].count(-1) == 1 and r["deprels"][r["heads"].index(-1)] == "root"
        assert is_projective(r["heads"]), r["words"]
        assert r["words"][-1] == "." and r["upos"][-1] == "PUNCT"


def test_same_seed_same_sentences_other_seed_others():
    assert treebank(30, seed=1) == treebank(30, seed=1)
    assert treebank(30, seed=1) != treebank(30, seed=2)


def test_agreement_links_pair_the_subject_and_its_attractors_with_the_verb(bank):
    seen = 0
    for r in bank:
        links = [link for link in r["links"] if link[0] == "agreement"]
        for _, noun, verb, label in links:
            assert r["upos"][verb] == "VERB" and r["upos"][noun] in ("NOUN", "PROPN")
            if label == "subject":
                assert r["heads"][noun] == verb and r["deprels"][noun] == "nsubj"
            else:  # an attractor sits between the subject and the verb and is not its subject
                subject = next(n for _, n, v, lab in links if v == verb and lab == "subject")
                assert subject < noun < verb and r["heads"][noun] != verb
                seen += 1
    assert seen > 50


def test_verbs_agree_in_number_with_their_subject(bank):
    singular, plural = {n[0] for n in NOUNS}, {n[1] for n in NOUNS}
    verbs = INTRANSITIVE + TRANSITIVE
    present_sg, present_pl = {v[0] for v in verbs}, {v[1] for v in verbs}
    checked = 0
    for r in bank:
        for i, (head, rel) in enumerate(zip(r["heads"], r["deprels"])):
            noun, verb = r["words"][i], r["words"][head] if head >= 0 else None
            if rel != "nsubj" or r["upos"][i] not in ("NOUN", "PROPN"):
                continue
            coordinated = any(h == i and d == "conj" for h, d in zip(r["heads"], r["deprels"]))
            number = "pl" if noun in plural or coordinated else \
                "sg" if noun in singular or r["upos"][i] == "PROPN" else None
            assert not (number == "pl" and verb in present_sg), (r["words"], noun, verb)
            assert not (number == "sg" and verb in present_pl), (r["words"], noun, verb)
            checked += 1
    assert checked > 400


def test_coref_links_point_from_the_pronoun_to_the_first_subject(bank):
    pronouns = set(PRONOUNS.values())
    found = 0
    for r in bank:
        for _, noun, pronoun, label in (link for link in r["links"] if link[0] == "coref"):
            assert r["words"][pronoun] in pronouns and noun < pronoun
            first_verb = r["heads"].index(-1)
            if label == "antecedent":
                assert r["heads"][noun] == first_verb and r["deprels"][noun] == "nsubj"
                found += 1
            else:
                assert not (r["heads"][noun] == first_verb and r["deprels"][noun] == "nsubj")
    assert found > 30


def test_some_words_need_their_context_for_their_part_of_speech(bank):
    tags = {}
    for r in bank:
        for w, t in zip(r["words"], r["upos"]):
            tags.setdefault(w.lower(), set()).add(t)
    ambiguous = {w for w, t in tags.items() if len(t) > 1}
    assert {"that"} <= ambiguous and ambiguous & {"watch", "walks", "plays", "visit", "dance", "calls"}


def test_splits_partition_the_sentences():
    splits = treebank_splits(100, seed=0, held_out=0.15)
    assert [len(splits[k]) for k in ("train", "dev", "test")] == [70, 15, 15]
    assert splits["train"] + splits["dev"] + splits["test"] == treebank(100, seed=0)
    with pytest.raises(ValueError, match="held_out"):
        treebank_splits(100, held_out=0.6)


def test_held_out_splits_keep_a_repeated_sentence_in_one_split():
    bank = treebank(60, seed=1)
    records = bank + bank[:20] + bank[:5]  # a file that repeats sentences (copies, not the same object)
    splits = held_out_splits([dict(r) for r in records], seed=3, held_out=0.2)
    where = {}
    for name, part in splits.items():
        for r in part:
            where.setdefault(tuple(r["words"]), set()).add(name)
    assert all(len(names) == 1 for names in where.values())  # no sentence both fitted on and scored
    assert sum(map(len, splits.values())) == len(records) and all(splits.values())
    assert abs(len(splits["test"]) - 17) <= 3 and abs(len(splits["dev"]) - 17) <= 3  # held_out of 85 each
    assert splits == held_out_splits([dict(r) for r in records], seed=3, held_out=0.2)  # the seed fixes it
    with pytest.raises(ValueError, match="2 distinct sentence"):
        held_out_splits(bank[:2] * 5, seed=0, held_out=0.2)
    small = held_out_splits(bank[:3], seed=0, held_out=0.1)
    assert [len(small[k]) for k in ("train", "dev", "test")] == [1, 1, 1]


@pytest.mark.parametrize("heads, reason", [
    ([1, -1, -1], "2 roots"),
    ([1, 2, 0], "no root"),
    ([1, 2, 1, -1], "cycle"),
    ([3, -1], "outside"),
    ([0, -1], "its own head"),
])
def test_tree_error_names_what_is_wrong(heads, reason):
    assert reason in tree_error(heads)


def test_projectivity_on_hand_trees():
    assert is_projective([1, -1, 1])  # a <- b -> c
    assert not is_projective([2, 3, -1, 2])  # arcs 0-2 and 1-3 cross
    assert not is_projective([2, -1, 1, 1])  # 0 -> 2 spans the root (word 1)


def test_held_out_splits_of_distinct_sentences_are_the_seeded_shuffle_cut_as_before():
    """Without repeats, dev and test are the n records before the last n, and the last n, of the seeded
    shuffle (as `probe --data` split before repeats were kept together): earlier results reproduce."""
    import random

    bank = treebank(40, seed=2)
    shuffled = list(bank)
    random.Random(7).shuffle(shuffled)
    splits = held_out_splits(list(bank), seed=7, held_out=0.15)
    assert splits == {"train": shuffled[:-12], "dev": shuffled[-12:-6], "test": shuffled[-6:]}
