"""A trained tokenizer as a function of its training text alone (huggingface/tokenizers#1794).

The `tokenizers` trainers keep their counts in Rust hash maps, whose iteration order changes
from one process to the next. train.py closes each way this reaches the result:

    WordPiece, BPE  the trainer numbers the word-internal ("##e") and word-final ("e</w>") forms
                    of single characters in hash order, and breaks ties between equally frequent
                    merges by id, so the merges, and at the cut-off the vocabulary itself, vary.
                    Naming those pieces (found by a first, merge-free pass) as special tokens of
                    the trainer fixes their ids; `canonical` then drops them from the special
                    tokens again.
    Unigram         the pieces' scores are sums of floats in hash order (last-bit noise), and the
                    characters the trainer must keep get min_score + k * 1e-4 with k in hash order.
                    `canonical` gives those characters their penalties in code-point order and
                    rounds every score to SCORE_DECIMALS places.

`canonical` also numbers every vocabulary the same way: the special tokens first, in their
order, then the single characters by code point, then (WordPiece, BPE) the fixed base pieces,
sorted, and the learned pieces in the order they were learned (BPE: merge rank), or (Unigram)
the pieces by score, best first, ties by their text. Ids are names only: a BPE model merges by
rank and WordPiece matches strings, so encoding is unchanged.

What can still vary: Unigram's scores come from floating-point sums, so a score within a
last-bit error of a rounding boundary, or two pieces whose pruning losses tie to the last bit,
can still come out differently (not seen in repeated runs); and BPE can queue one pair twice when two merges
make the same string, and which copy goes first is heap order.
"""
from __future__ import annotations

import json

from tokenizers import Tokenizer as Backend

SCORE_DECIMALS = 6  # far above the last-bit noise of a log-probability, far below any real difference
PENALTY = 0.0001  # the Unigram trainer's step between the scores of the characters it must keep


def base_pieces(backend: Backend, specials) -> list:
    """The pieces a merge-free WordPiece / BPE training made beyond the specials and characters, sorted.

    These are the "##e" / "e</w>" forms of single characters: the pieces the trainer numbers in
    hash order.
    """
    return sorted(t for t in backend.get_vocab() if len(t) > 1 and t not in set(specials))


def renumbered(vocab: dict, specials, base) -> dict:
    """token -> id of a WordPiece / BPE vocabulary in the canonical order (see the module docstring)."""
    by_id = sorted(vocab, key=vocab.get)
    n = len(specials)
    if by_id[:n] != list(specials):
        raise AssertionError(f"the trainer did not put the special tokens first: {by_id[:n]}")
    fixed = set(base)
    chars = sorted(t for t in by_id[n:] if len(t) == 1)
    learned = [t for t in by_id[n:] if len(t) > 1 and t not in fixed]  # in the order of learning
    order = [*specials, *chars, *sorted(fixed), *learned]
    return {token: i for i, token in enumerate(order)}


def _penalised(pieces: list) -> set:
    """The single characters whose scores are exactly min_score + k * PENALTY, as the trainer adds them."""
    low = min(score for _, score in pieces)
    scores, penalty = set(), 0.0
    for _ in range(sum(len(p) == 1 for p, _ in pieces)):
        scores.add(low + penalty)
        penalty += PENALTY  # added up step by step, as the trainer does, so the floats match exactly
    return {p for p, score in pieces if len(p) == 1 and score in scores}


def canonical_pieces(vocab: list, n_specials: int) -> list:
    """[piece, score] pairs of a Unigram vocabulary in canonical order with canonical scores."""
    specials, pieces = vocab[:n_specials], [(p, s) for p, s in vocab[n_specials:]]
    if not pieces:
        return vocab
    kept = _penalised(pieces)
    # the trainer hands out its penalties in hash order: hand the same scores out by code point
    rescored = dict(zip(sorted(kept), sorted(s for p, s in pieces if p in kept)))
    pieces = [(p, round(rescored.get(p, s), SCORE_DECIMALS)) for p, s in pieces]
    pieces.sort(key=lambda ps: (-ps[1], ps[0]))
    return [list(s) for s in specials] + [[p, s] for p, s in pieces]


def canonical(backend: Backend, specials, base=()) -> Backend:
    """`backend` renumbered (and, for Unigram, rescored) canonically, without the `base` special tokens."""
    data = json.loads(backend.to_str())
    model = data["model"]
    if model["type"] == "Unigram":
        if [p for p, _ in model["vocab"][:len(specials)]] != list(specials):
            raise AssertionError("the trainer did not put the special tokens first")
        unk = model.get("unk_id")
        unk = None if unk is None else model["vocab"][unk][0]
        model["vocab"] = canonical_pieces(model["vocab"], len(specials))
        ids = {piece: i for i, (piece, _) in enumerate(model["vocab"])}
        model["unk_id"] = None if unk is None else ids[unk]
    else:
        model["vocab"] = ids = renumbered(model["vocab"], specials, base)
    dropped = set(base)
    data["added_tokens"] = [{**t, "id": ids[t["content"]]} for t in data["added_tokens"]
                            if t["content"] not in dropped]
    return Backend.from_str(json.dumps(data))

