"""Example builders: from tokenised documents (lists of sentences of ids) to training examples.

- BERT segment pairs with next-sentence labels (Devlin et al. 2019, appendix A.2): A is
  one or more sentences, B is the real continuation (label 0, IsNext) or, half the time,
  text from another document (label 1, NotNext); [CLS] A [SEP] B [SEP] with segment ids;
  the longer side loses a token from its front or back at random until the pair fits.
- ALBERT sentence-order pairs (Lan et al. 2020, sec. 4.1): two consecutive segments,
  swapped half the time (label 1).
- RoBERTa FULL-SENTENCES (packing may cross documents, with a separator) and
  DOC-SENTENCES (never crosses a document) without NSP (Liu et al. 2019, sec. 4.2).
- Contiguous blocks for causal LM, and source/target pairs for encoder-decoders.
"""
from __future__ import annotations

import random


def truncate_pair(a: list, b: list, budget: int, rng: random.Random) -> tuple:
    """Drop tokens from the longer of a and b (front or back, at random) until they fit."""
    a, b = list(a), list(b)
    while len(a) + len(b) > budget:
        longer = a if len(a) > len(b) else b
        longer.pop(0 if rng.random() < 0.5 else -1)
    return a, b


def pair_example(a: list, b: list, label: int, cls: int, sep: int, max_len: int, rng: random.Random) -> dict:
    """[CLS] a [SEP] b [SEP] with segment ids 0/1 and the pair label."""
    a, b = truncate_pair(a, b, max_len - 3, rng)
    return {"input_ids": [cls, *a, sep, *b, sep], "segment_ids": [0] * (len(a) + 2) + [1] * (len(b) + 1),
            "pair_label": label}


def _split_point(chunk: list, rng: random.Random) -> int:
    return rng.randint(1, len(chunk) - 1) if len(chunk) > 1 else 1


def _chunks(doc: list, target: int):
    """Consecutive sentences of a document grouped until they reach `target` tokens."""
    chunk, size = [], 0
    for sentence in doc:
        chunk.append(sentence)
        size += len(sentence)
        if size >= target:
            yield chunk
            chunk, size = [], 0
    if chunk:
        yield chunk


def nsp_pairs(docs: list, cls: int, sep: int, max_len: int = 128, seed: int = 0,
              short_seq_prob: float = 0.1) -> list:
    """BERT's next-sentence examples (50 % IsNext = 0, 50 % NotNext = 1, from another document)."""
    rng = random.Random(seed)
    out = []
    for d, doc in enumerate(docs):
        target = rng.randint(2, max_len - 3) if rng.random() < short_seq_prob else max_len - 3
        for chunk in _chunks(doc, target):
            if len(chunk) < 2:  # no real continuation to offer: skipping keeps the classes balanced
                continue
            cut = _split_point(chunk, rng)
            a = [t for s in chunk[:cut] for t in s]
            if rng.random() < 0.5 and len(docs) > 1:
                other = rng.randrange(len(docs) - 1)
                other += other >= d  # any document but this one
                start = rng.randrange(len(docs[other]))
                b, label = [t for s in docs[other][start:] for t in s][: max_len], 1
            else:
                b, label = [t for s in chunk[cut:] for t in s], 0
            if a and b:
                out.append(pair_example(a, b, label, cls, sep, max_len, rng))
    return out


def sop_pairs(docs: list, cls: int, sep: int, max_len: int = 128, seed: int = 0) -> list:
    """ALBERT's sentence-order examples: consecutive segments, swapped (label 1) half the time."""
    rng = random.Random(seed)
    out = []
    for doc in docs:
        for chunk in _chunks(doc, max_len - 3):
            if len(chunk) < 2:
                continue
            cut = _split_point(chunk, rng)
            a, b = [t for s in chunk[:cut] for t in s], [t for s in chunk[cut:] for t in s]
            swap = rng.random() < 0.5
            out.append(pair_example(b, a, 1, cls, sep, max_len, rng) if swap
                       else pair_example(a, b, 0, cls, sep, max_len, rng))
    return out


def pack_sentences(docs: list, bos: int, eos: int, max_len: int = 128, cross_documents: bool = True,
                   doc_sep: int | None = None) -> list:
    """RoBERTa's FULL-SENTENCES (cross_documents) or DOC-SENTENCES packing: <s> sentences </s>."""
    out, current = [], []
    budget = max_len - 2

    def flush():
        if current:
            out.append({"input_ids": [bos, *current[:budget], eos]})
        current.clear()

    for doc in docs:
        for sentence in doc:
            if current and len(current) + len(sentence) > budget:
                flush()
            current.extend(sentence)
        if not cross_documents:
            flush()
        elif current and doc_sep is not None:
            current.append(doc_sep)
    flush()
    return out


def blocks(docs: list, block: int, eos: int | None = None) -> list:
    """Contiguous blocks of `block` tokens over the concatenated documents (causal LM)."""
    stream = [t for doc in docs for t in ([*(t for s in doc for t in s)] + ([eos] if eos is not None else []))]
    return [{"input_ids": stream[i:i + block]} for i in range(0, len(stream) - block + 1, block)]


def source_target(pairs: list, max_source: int, max_target: int) -> list:
    """(source ids, target ids) pairs for an encoder-decoder, truncated to the limits."""
    return [{"input_ids": list(s[:max_source]), "target_ids": list(t[:max_target])} for s, t in pairs]


SSO_NEXT, SSO_PREVIOUS, SSO_RANDOM = 0, 1, 2  # StructBERT's sentence-structural labels


def _other_text(docs: list, d: int, n: int, rng: random.Random) -> list:
    """Up to n tokens of a document other than docs[d], from a random sentence on."""
    other = rng.randrange(len(docs) - 1)
    other += other >= d  # any document but this one
    start = rng.randrange(len(docs[other]))
    return [t for s in docs[other][start:] for t in s][:n]


def sso_pairs(docs: list, cls: int, sep: int, max_len: int = 128, seed: int = 0,
              short_seq_prob: float = 0.1) -> list:
    """StructBERT's sentence-structural examples (Wang et al. 2020, sec. 2.2): S2 follows S1
    (label 0), precedes it (1) or comes from another document (2), a third of the time each."""
    rng = random.Random(seed)
    classes = 3 if len(docs) > 1 else 2  # no random class without a second document
    out = []
    for d, doc in enumerate(docs):
        target = rng.randint(2, max_len - 3) if rng.random() < short_seq_prob else max_len - 3
        for chunk in _chunks(doc, target):
            if len(chunk) < 2:  # no neighbouring segment: skipping keeps the classes balanced
                continue
            cut = _split_point(chunk, rng)
            first, second = [t for s in chunk[:cut] for t in s], [t for s in chunk[cut:] for t in s]
            label = rng.randrange(classes)
            if label == SSO_NEXT:
                s1, s2 = first, second
            elif label == SSO_PREVIOUS:
                s1, s2 = second, first
            else:  # as long as the real neighbour, so the length says nothing about the class
                s1, s2 = first, _other_text(docs, d, len(second), rng)
            out.append(pair_example(s1, s2, label, cls, sep, max_len, rng))
    return out
