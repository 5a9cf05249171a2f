import random

import pytest

from lmforge.data.examples import (blocks, nsp_pairs, pack_sentences, pair_example, sentence_nsp_pairs,
                                   sop_pairs, sso_pairs, truncate_pair)

CLS, SEP = 1, 2


def _docs(n=400, seed=0):
    rng = random.Random(seed)
    # document d's sentences hold ids 1000*d + k so the origin of every token is known
    return [[[1000 * (d + 1) + 100 * s + k for k in range(rng.randint(3, 12))]
             for s in range(rng.randint(2, 9))]
            for d in range(n)]


def test_nsp_is_half_is_next_and_never_too_long():
    docs = _docs(7000)
    pairs = nsp_pairs(docs, CLS, SEP, max_len=32, seed=0)
    assert len(pairs) >= 10_000
    is_next = sum(p["pair_label"] == 0 for p in pairs) / len(pairs)
    assert abs(is_next - 0.5) < 0.02
    for p in pairs:
        ids, seg = p["input_ids"], p["segment_ids"]
        assert len(ids) <= 32 and len(ids) == len(seg) and ids[0] == CLS and ids[-1] == SEP
        first_sep = ids.index(SEP)
        a, b = ids[1:first_sep], ids[first_sep + 1:-1]
        assert seg == [0] * (len(a) + 2) + [1] * (len(b) + 1)
        same_doc = {t // 1000 for t in a} == {t // 1000 for t in b}
        assert same_doc == (p["pair_label"] == 0)


def test_sop_swaps_half_and_keeps_one_document():
    pairs = sop_pairs(_docs(2000), CLS, SEP, max_len=48, seed=1)
    swapped = [p for p in pairs if p["pair_label"] == 1]
    assert abs(len(swapped) / len(pairs) - 0.5) < 0.03
    for p in pairs:
        ids = p["input_ids"]
        cut = ids.index(SEP)
        a, b = ids[1:cut], ids[cut + 1:-1]
        assert (max(a) < min(b)) == (p["pair_label"] == 0) or not (a and b)


def test_truncation_trims_the_longer_side_golden():
    # seeded: three tokens leave from the front, three from the back; the shorter side is untouched
    assert truncate_pair(list(range(10)), [100, 101], 6, random.Random(0)) == ([3, 4, 5, 6], [100, 101])
    assert pair_example([5], [6, 7], 0, CLS, SEP, 16, random.Random(0)) == {
        "input_ids": [1, 5, 2, 6, 7, 2], "segment_ids": [0, 0, 0, 1, 1, 1], "pair_label": 0}


def test_packing_full_and_doc_sentences():
    docs = [[[1, 1, 1], [1, 1]], [[2, 2, 2, 2]], [[3] * 3]]
    full = pack_sentences(docs, 0, 9, max_len=9, cross_documents=True)
    assert full == [{"input_ids": [0, 1, 1, 1, 1, 1, 9]}, {"input_ids": [0, 2, 2, 2, 2, 3, 3, 3, 9]}]
    per_doc = pack_sentences(docs, 0, 9, max_len=9, cross_documents=False)
    assert [len(e["input_ids"]) for e in per_doc] == [7, 6, 5]


@pytest.mark.parametrize("cross", [True, False])
def test_packing_keeps_every_token_of_a_sentence_longer_than_max_len(cross):
    """A long sentence is packed as pieces of max_len - 2: every token once, in order (its tail was lost)."""
    docs = [[[7] * 3, list(range(100, 125)), [8] * 2], [list(range(200, 211))]]
    out = pack_sentences(docs, 0, 9, max_len=10, cross_documents=cross)
    assert all(len(e["input_ids"]) <= 10 for e in out)
    assert [t for e in out for t in e["input_ids"][1:-1]] == [t for d in docs for s in d for t in s]
    with pytest.raises(ValueError, match="max_len=2"):
        pack_sentences(docs, 0, 9, max_len=2)


def test_blocks_are_contiguous():
    out = blocks([[[1, 2, 3], [4]], [[5, 6, 7]]], 3, eos=0)
    assert [e["input_ids"] for e in out] == [[1, 2, 3], [4, 0, 5], [6, 7, 0]]


def test_truncation_equals_popping_the_longer_side_one_token_at_a_time():
    def popping(a, b, budget, rng):  # the definition (BERT's truncate_seq_pair, with a random end)
        a, b = list(a), list(b)
        while len(a) + len(b) > budget:
            longer = a if len(a) > len(b) else b
            longer.pop(0 if rng.random() < 0.5 else -1)
        return a, b

    for la in range(0, 40, 3):
        for lb in range(0, 40, 4):
            for budget in (0, 5, 17, 40):
                a, b = list(range(la)), list(range(100, 100 + lb))
                seed = 1000 * la + 10 * lb + budget
                assert truncate_pair(a, b, budget, random.Random(seed)) == \
                    popping(a, b, budget, random.Random(seed))


def test_pair_builders_are_seeded():
    docs = _docs(300)
    for build in (nsp_pairs, sop_pairs):
        assert build(docs, CLS, SEP, max_len=24, seed=4) == build(docs, CLS, SEP, max_len=24, seed=4)
        assert build(docs, CLS, SEP, max_len=24, seed=4) != build(docs, CLS, SEP, max_len=24, seed=5)


def test_sentence_pairs_are_one_sentence_each_and_half_next():
    # RoBERTa's SENTENCE-PAIR + NSP: A and B are whole single sentences; B is A's successor exactly
    # when the label says IsNext (0), else a sentence of another document
    docs = _docs(3000)
    pairs = sentence_nsp_pairs(docs, CLS, SEP, max_len=64, seed=0)
    assert abs(sum(p["pair_label"] == 0 for p in pairs) / len(pairs) - 0.5) < 0.03
    sentences = {tuple(s) for doc in docs for s in doc}
    for p in pairs:
        ids = p["input_ids"]
        cut = ids.index(SEP)
        a, b = ids[1:cut], ids[cut + 1:-1]
        assert tuple(a) in sentences and tuple(b) in sentences  # 64 tokens hold any two of them whole
        successor = b[0] // 100 == a[0] // 100 + 1  # same document, the next sentence
        assert successor == (p["pair_label"] == 0)


def test_nsp_not_next_is_shaped_like_is_next():
    # BERT's random B is whole sentences of another document as long as the real B; a B of max_len tokens
    # cut to fit made NotNext pairs longer and start mid-sentence (37 % at a sentence start vs 77 %)
    rng = random.Random(1)
    docs = [[[1000 * (d + 1) + 100 * s + k for k in range(rng.randint(3, 12))]
             for s in range(rng.randint(10, 30))]
            for d in range(500)]
    pairs = nsp_pairs(docs, CLS, SEP, max_len=64, seed=0)
    stats = {}
    for label in (0, 1):
        bs = [p["input_ids"][p["input_ids"].index(SEP) + 1:-1] for p in pairs if p["pair_label"] == label]
        at_start = sum(b[0] % 100 == 0 for b in bs) / len(bs)  # k == 0: a sentence's first token
        stats[label] = at_start, sum(len(p["input_ids"]) for p in pairs if p["pair_label"] == label) / len(bs)
    assert abs(stats[0][0] - stats[1][0]) < 0.06 and abs(stats[0][1] - stats[1][1]) < 3


@pytest.mark.parametrize("builder", [nsp_pairs, sso_pairs, sentence_nsp_pairs])
def test_an_empty_document_is_never_the_random_segment(builder):
    # it raised "empty range for randrange()" when drawn as the other document
    docs = [[[5, 6, 7], [8, 9]], [], [[10, 11], [12, 13, 14]]] * 20
    pairs = builder(docs, CLS, SEP, max_len=16, seed=0)
    assert pairs and all(SEP not in p["input_ids"][p["input_ids"].index(SEP) + 1:-1] for p in pairs)
    assert all(p["input_ids"][-2] != SEP for p in pairs)  # B is never empty
