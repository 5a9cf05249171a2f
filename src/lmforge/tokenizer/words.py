"""Word boundaries in token ids, for whole-word and span masking.

A word is a first piece and its continuations, as the tokenizer's own markers say:

    WordPiece, BPE with a continuing prefix   "##" marks a continuation     un ##aff ##able
    BPE with an end-of-word suffix            "</w>" ends a word            un aff able</w>
    byte-level BPE                            "Ġ" (a leading space) starts   Ġun aff able
    SentencePiece / Unigram, Metaspace        "▁" (a leading space) starts   ▁un aff able
    word-level                                every token is a word

The first piece, and the piece after an added token, always start a word: GPT-2 writes
the first word without its space. Added tokens ([CLS], <pad>, [UNK], <extra_id_0>) are
words of their own, so an unknown piece inside a word splits it. After a line break
("Ċ" in byte-level BPE) a new word starts even without a leading space.
"""
from __future__ import annotations

import numbers

from tokenizers.models import WordLevel

from lmforge.utils.errors import shown

METASPACE = "\u2581"  # "▁"
# byte-level BPE spells byte b < 33 as chr(256 + b): space Ġ, and \t \n \v \f \r as ĉ Ċ ċ Č č
BYTE_SPACE = chr(256 + 32)
BYTE_BREAKS = "".join(chr(256 + b) for b in (9, 10, 11, 12, 13))


def _is_byte_level(backend) -> bool:
    """Whether the pre-tokenizer or decoder is (or holds) ByteLevel."""
    for part in (backend.pre_tokenizer, backend.decoder):
        if part is not None and b'"ByteLevel"' in part.__getstate__():
            return True
    return False


def boundary_rule(backend) -> tuple:
    """How a `tokenizers.Tokenizer` marks words: (rule, marker, breaks) with rule one of
    prefix (the marker begins a continuation), suffix (the marker ends a word), space (the
    marker begins a word; a piece ending in one of `breaks` ends one) or word (every piece)."""
    model = backend.model
    if isinstance(model, WordLevel):
        return "word", "", ""
    if getattr(model, "end_of_word_suffix", None):
        return "suffix", model.end_of_word_suffix, ""
    if getattr(model, "continuing_subword_prefix", None):  # WordPiece's ##, or BPE's
        return "prefix", model.continuing_subword_prefix, ""
    if _is_byte_level(backend):
        return "space", BYTE_SPACE, BYTE_BREAKS
    return "space", METASPACE, "\n\t\r"


def _starts_word(rule: str, marker: str, breaks: str, piece: str, previous: str) -> bool:
    if rule == "prefix":
        return not piece.startswith(marker)
    if rule == "suffix":
        return previous.endswith(marker)
    if rule == "word":
        return True
    begins = bool(piece) and piece[0] in marker + breaks
    return begins or (bool(previous) and previous[-1] in breaks)


def token_ids(ids, job: str) -> list:
    """`ids` (a list or 1-D tensor of integers) as Python ints, each checked to be a token id; a ValueError
    naming `job` and the first bad one otherwise."""
    ids = ids.tolist() if hasattr(ids, "tolist") else list(ids)
    # numpy's integers as Python's; the backend's OverflowError / "'list' object cannot be interpreted as
    # an integer" named no id
    ids = [int(i) if isinstance(i, numbers.Integral) and not isinstance(i, bool) else i for i in ids]
    bad = next((i for i in ids if type(i) is not int or not 0 <= i < 2**32), None)
    if bad is not None:
        raise ValueError(f"{job} takes one sequence of token ids (ints >= 0), got {shown(bad)}")
    return ids


def word_starts(tokenizer, ids) -> list:
    """True at the first piece of each word of `ids` (a list or 1-D tensor); added tokens are words."""
    return unchecked_word_starts(tokenizer, token_ids(ids, "word_starts"))


def unchecked_word_starts(tokenizer, ids: list) -> list:
    """word_starts of `ids` taken as they are: Python ints that are token ids, as examples a caller built
    hold (data/stream.py's, on every whole-word example: the check is the public word_starts's)."""
    backend = tokenizer.backend
    rule, marker, breaks = boundary_rule(backend)
    added = set(backend.get_added_tokens_decoder())
    starts, previous = [], None  # previous piece; None at the start and after an added token
    for i in ids:
        piece = backend.id_to_token(i)
        if i in added or piece is None:
            starts.append(True)
            previous = None
            continue
        starts.append(previous is None or _starts_word(rule, marker, breaks, piece, previous))
        previous = piece
    return starts
