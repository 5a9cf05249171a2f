"""Example builders: from tokenised documents (lists of sentences of ids) to training examples.

- BERT segment pairs with next-sentence labels (Devlin et al. 2019, appendix A.2): A is
  one or more sentences, B is the real continuation (label 0, IsNext) or, half the time,
  whole sentences of another document as long as it (label 1, NotNext); [CLS] A [SEP] B [SEP];
  the longer side loses a token from its front or back at random until the pair fits.
- ALBERT sentence-order pairs (Lan et al. 2020, sec. 4.1): two consecutive segments,
  swapped half the time (label 1).
- StructBERT sentence-structural pairs (Wang et al. 2020, sec. 2.2): next, previous or random.
- RoBERTa SENTENCE-PAIR + NSP (Liu et al. 2019, sec. 4.2): A is one natural sentence, B the
  next sentence of its document (label 0) or, half the time, a sentence of another (label 1).
- RoBERTa FULL-SENTENCES (packing may cross documents, with a separator) and
  DOC-SENTENCES (never crosses a document) without NSP (Liu et al. 2019, sec. 4.2).
- Contiguous blocks for causal LM, and source/target pairs for encoder-decoders.

The pair objectives are defined once, as plans (`plan_nsp`, `plan_sop`, `plan_sso`,
`plan_sentence_nsp`): from
the documents' sentence offsets alone, one row of PLAN per example, every random draw
(truncation included) made in the order the builders always made them. `nsp_pairs` and
friends assemble a plan over documents in memory; lmforge.data.stream.PackedPairs over
memory-mapped shards, so a corpus's pairs cost a few bytes each until they are read.
"""
from __future__ import annotations

import random
from array import array
from bisect import bisect_left
from itertools import accumulate

import numpy as np

# a plan row: segment A and segment B as (document, first token, end token), then the label
PLAN = ("doc_a", "lo_a", "hi_a", "doc_b", "lo_b", "hi_b", "label")
SSO_NEXT, SSO_PREVIOUS, SSO_RANDOM = 0, 1, 2  # StructBERT's sentence-structural labels


def _drops(la: int, lb: int, budget: int, rng: random.Random) -> tuple:
    """(a front, a back, b front, b back): the tokens truncate_pair drops, from the lengths alone.

    Each pop takes the longer side (b on a tie), so pops go to the longer side until the
    lengths meet, then alternate b, a, b, ...; a pop's draw under 0.5 takes the front."""
    if budget < 0:
        raise ValueError(f"no room for a pair: budget {budget}")
    n = la + lb - budget
    if n <= 0:
        return 0, 0, 0, 0
    draw = rng.random
    backs = [draw() >= 0.5 for _ in range(n)]  # one draw per pop, in pop order: the hot loop of planning
    lead = min(n, abs(la - lb))
    a = (backs[:lead] if la > lb else []) + backs[lead + 1::2]
    b = (backs[:lead] if la <= lb else []) + backs[lead::2]
    return len(a) - sum(a), sum(a), len(b) - sum(b), sum(b)


def truncate_pair(a: list, b: list, budget: int, rng: random.Random) -> tuple:
    """Drop tokens from the longer of a and b (front or back, at random) until they fit."""
    a_front, a_back, b_front, b_back = _drops(len(a), len(b), budget, rng)
    return list(a[a_front:len(a) - a_back]), list(b[b_front:len(b) - b_back])


def _pair(a: list, b: list, label: int, cls: int, sep: int) -> dict:
    return {"input_ids": [cls, *a, sep, *b, sep], "segment_ids": [0] * (len(a) + 2) + [1] * (len(b) + 1),
            "pair_label": label}


def pair_example(a: list, b: list, label: int, cls: int, sep: int, max_len: int, rng: random.Random) -> dict:
    """[CLS] a [SEP] b [SEP] with segment ids 0/1 and the pair label."""
    return _pair(*truncate_pair(a, b, max_len - 3, rng), label, cls, sep)


def pair_from_plan(row, segment, cls: int, sep: int) -> dict:
    """The example of one PLAN row; `segment(document, lo, hi)` gives those token ids as a list."""
    doc_a, lo_a, hi_a, doc_b, lo_b, hi_b, label = row
    return _pair(segment(doc_a, lo_a, hi_a), segment(doc_b, lo_b, hi_b), label, cls, sep)


def _chunk_bounds(offsets: list, target: int):
    """(first, end) sentences of the chunks of a document: consecutive sentences grouped until they
    reach `target` tokens; `offsets` are its sentences' token offsets, then its length."""
    first = 0
    for k in range(1, len(offsets)):
        if offsets[k] - offsets[first] >= target:
            yield first, k
            first = k
    if first < len(offsets) - 1:
        yield first, len(offsets) - 1


def _splits(n_docs: int, offsets, target, rng: random.Random):
    """(document, its offsets, first, cut, end sentence) of every chunk of two or more sentences,
    cut at random; `target(rng)` draws each document's chunk length."""
    for d in range(n_docs):
        off = offsets(d)
        for lo, hi in _chunk_bounds(off, target(rng)):
            if hi - lo >= 2:  # no real continuation otherwise: skipping keeps the classes balanced
                yield d, off, lo, lo + rng.randint(1, hi - lo - 1), hi


def _bert_target(max_len: int, short_seq_prob: float):
    """BERT's chunk length: max_len - 3, or a random shorter one with probability short_seq_prob."""
    return lambda rng: rng.randint(2, max_len - 3) if rng.random() < short_seq_prob else max_len - 3


def _other(n_docs: int, d: int, offsets, n: int, rng: random.Random, whole: bool = False) -> tuple:
    """(document, lo, hi): up to n tokens of a document other than d, from a random sentence on; with
    `whole`, whole sentences until they reach n tokens (BERT's random next), the last one not cut."""
    other = rng.randrange(n_docs - 1)
    other += other >= d  # any document but this one
    off = offsets(other)
    if len(off) < 2:  # a document without sentences: an empty segment, which the plans skip
        return other, 0, 0
    k = rng.randrange(len(off) - 1)
    start = off[k]
    if whole:
        return other, start, off[min(bisect_left(off, start + n, k + 1), len(off) - 1)]
    return other, start, min(start + n, off[-1])


class _Plan:
    """PLAN rows as they are drawn: 7 int32 per example."""

    def __init__(self, max_len: int, rng: random.Random) -> None:
        self.rows, self.budget, self.rng = array("i"), max_len - 3, rng

    def add(self, first: tuple, second: tuple, label: int) -> None:
        """Append [CLS] first [SEP] second [SEP], truncated as pair_example does."""
        (doc_a, lo_a, hi_a), (doc_b, lo_b, hi_b) = first, second
        a_front, a_back, b_front, b_back = _drops(hi_a - lo_a, hi_b - lo_b, self.budget, self.rng)
        self.rows.extend((doc_a, lo_a + a_front, hi_a - a_back, doc_b, lo_b + b_front, hi_b - b_back, label))

    def array(self) -> np.ndarray:
        """The rows, (n, 7) int32."""
        rows = np.frombuffer(self.rows, np.int32) if self.rows else np.zeros(0, np.int32)
        return rows.reshape(-1, len(PLAN))


def plan_nsp(n_docs: int, offsets, max_len: int = 128, seed: int = 0,
             short_seq_prob: float = 0.1) -> np.ndarray:
    """The PLAN of BERT's next-sentence examples over documents 0..n_docs-1, `offsets(d)` giving
    document d's sentence token offsets and length (50 % IsNext = 0, 50 % NotNext = 1)."""
    rng = random.Random(seed)
    plan = _Plan(max_len, rng)
    for d, off, lo, cut, hi in _splits(n_docs, offsets, _bert_target(max_len, short_seq_prob), rng):
        if rng.random() < 0.5 and n_docs > 1:
            # whole sentences as long as the real B (BERT collects whole sentences too): a B of max_len
            # tokens cut to fit made NotNext pairs full-length and start mid-sentence, cues to the label
            b, label = _other(n_docs, d, offsets, off[hi] - off[cut], rng, whole=True), 1
        else:
            b, label = (d, off[cut], off[hi]), 0
        if off[cut] > off[lo] and b[2] > b[1]:
            plan.add((d, off[lo], off[cut]), b, label)
    return plan.array()


def plan_sentence_nsp(n_docs: int, offsets, max_len: int = 128, seed: int = 0) -> np.ndarray:
    """The PLAN of RoBERTa's SENTENCE-PAIR + NSP examples (as plan_nsp): single sentences, A and the
    next one (label 0) or, half the time, a random sentence of another document (label 1)."""
    rng = random.Random(seed)
    plan = _Plan(max_len, rng)
    for d in range(n_docs):
        off = offsets(d)
        for i in range(0, len(off) - 2, 2):  # disjoint pairs: every sentence is an A or a B once
            b, label = (d, off[i + 1], off[i + 2]), 0
            if rng.random() < 0.5 and n_docs > 1:
                other = rng.randrange(n_docs - 1)
                other += other >= d
                o = offsets(other)
                j = rng.randrange(len(o) - 1) if len(o) > 1 else 0  # no sentence: skipped below
                b, label = (other, o[j], o[min(j + 1, len(o) - 1)]), 1
            if off[i + 1] > off[i] and b[2] > b[1]:
                plan.add((d, off[i], off[i + 1]), b, label)
    return plan.array()


def plan_sop(n_docs: int, offsets, max_len: int = 128, seed: int = 0) -> np.ndarray:
    """The PLAN of ALBERT's sentence-order examples (as plan_nsp): swapped (label 1) half the time."""
    rng = random.Random(seed)
    plan = _Plan(max_len, rng)
    for d, off, lo, cut, hi in _splits(n_docs, offsets, lambda _: max_len - 3, rng):
        a, b = (d, off[lo], off[cut]), (d, off[cut], off[hi])
        if rng.random() < 0.5:
            plan.add(b, a, 1)
        else:
            plan.add(a, b, 0)
    return plan.array()


def plan_sso(n_docs: int, offsets, max_len: int = 128, seed: int = 0,
             short_seq_prob: float = 0.1) -> np.ndarray:
    """The PLAN of StructBERT's sentence-structural examples (as plan_nsp): S2 follows S1 (label 0),
    precedes it (1) or comes from another document (2), a third of the time each."""
    rng = random.Random(seed)
    plan = _Plan(max_len, rng)
    classes = 3 if n_docs > 1 else 2  # no random class without a second document
    for d, off, lo, cut, hi in _splits(n_docs, offsets, _bert_target(max_len, short_seq_prob), rng):
        first, second = (d, off[lo], off[cut]), (d, off[cut], off[hi])
        label = rng.randrange(classes)
        if label == SSO_PREVIOUS:
            first, second = second, first
        elif label == SSO_RANDOM:  # as long as the real neighbour, so the length says nothing about the class
            second = _other(n_docs, d, offsets, off[hi] - off[cut], rng)
        if second[2] > second[1]:
            plan.add(first, second, label)
    return plan.array()


def sentence_budget(max_len: int) -> int:
    """Tokens of sentences a packed example holds between <s> and </s>; a ValueError where none fit."""
    if max_len < 3:
        raise ValueError(f"max_len={max_len} leaves no room for a token between <s> and </s>")
    return max_len - 2


def pack_sentences(docs: list, bos: int, eos: int, max_len: int = 128, cross_documents: bool = True,
                   doc_sep: int | None = None) -> list:
    """RoBERTa's FULL-SENTENCES (cross_documents) or DOC-SENTENCES packing: <s> sentences </s>; a sentence
    longer than max_len - 2 is packed as pieces of that length (its tail was dropped)."""
    out, current = [], []
    budget = sentence_budget(max_len)

    def flush():
        if current:
            out.append({"input_ids": [bos, *current[:budget], eos]})
        current.clear()

    for doc in docs:
        for piece in (s[k:k + budget] for s in doc for k in range(0, len(s), budget)):
            if current and len(current) + len(piece) > budget:
                flush()
            current.extend(piece)
        if not cross_documents:
            flush()
        elif current and doc_sep is not None:
            current.append(doc_sep)
    flush()
    return out


def blocks(docs: list, block: int, eos: int | None = None) -> list:
    """Contiguous blocks of `block` tokens over the concatenated documents (causal LM); the last tokens,
    fewer than a block, are left out (as the reference's causal-LM example groups texts)."""
    stream = [t for doc in docs
              for t in ([*(t for s in doc for t in s)] + ([eos] if eos is not None else []))]
    return [{"input_ids": stream[i:i + block]} for i in range(0, len(stream) - block + 1, block)]


def source_target(pairs: list, max_source: int, max_target: int) -> list:
    """(source ids, target ids) pairs for an encoder-decoder, truncated to the limits."""
    return [{"input_ids": list(s[:max_source]), "target_ids": list(t[:max_target])} for s, t in pairs]


def _assemble(plan, docs, cls: int, sep: int, **options) -> list:
    """The examples of `plan(n_docs, offsets, **options)` over documents in memory."""
    offsets, flat = [], []
    for doc in docs:
        offsets.append([0, *accumulate(map(len, doc))])
        flat.append([t for s in doc for t in s])
    rows = plan(len(offsets), offsets.__getitem__, **options)
    return [pair_from_plan(row, lambda d, lo, hi: flat[d][lo:hi], cls, sep) for row in rows.tolist()]


def nsp_pairs(docs: list, cls: int, sep: int, max_len: int = 128, seed: int = 0,
              short_seq_prob: float = 0.1) -> list:
    """BERT's next-sentence examples (50 % IsNext = 0, 50 % NotNext = 1, from another document)."""
    return _assemble(plan_nsp, docs, cls, sep, max_len=max_len, seed=seed, short_seq_prob=short_seq_prob)


def sentence_nsp_pairs(docs: list, cls: int, sep: int, max_len: int = 128, seed: int = 0) -> list:
    """RoBERTa's SENTENCE-PAIR + NSP examples: one sentence each side, next (0) or another document's (1)."""
    return _assemble(plan_sentence_nsp, docs, cls, sep, max_len=max_len, seed=seed)


def sop_pairs(docs: list, cls: int, sep: int, max_len: int = 128, seed: int = 0) -> list:
    """ALBERT's sentence-order examples: consecutive segments, swapped (label 1) half the time."""
    return _assemble(plan_sop, docs, cls, sep, max_len=max_len, seed=seed)


def sso_pairs(docs: list, cls: int, sep: int, max_len: int = 128, seed: int = 0,
              short_seq_prob: float = 0.1) -> list:
    """StructBERT's sentence-structural examples (Wang et al. 2020, sec. 2.2): S2 follows S1
    (label 0), precedes it (1) or comes from another document (2), a third of the time each."""
    return _assemble(plan_sso, docs, cls, sep, max_len=max_len, seed=seed, short_seq_prob=short_seq_prob)
