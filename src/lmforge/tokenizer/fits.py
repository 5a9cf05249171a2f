"""Whether a tokenizer fits a model: every id it can emit must have a row in the model's embeddings.

A tokenizer with fewer ids than the model's vocabulary is normal (vocabularies are padded to a
multiple of 8 or 64 for speed: GPT-2's 50257 ids in a 50304-row table); one that can emit an id
at or past vocab_size would index past the table, or, worse, read a row trained for another token.
"""
from __future__ import annotations

from lmforge.utils.errors import OptionsError


def id_count(tokenizer) -> int:
    """One more than the highest id the tokenizer can emit, added tokens included (ids may have gaps,
    so this is not always its vocab_size)."""
    backend = getattr(tokenizer, "backend", tokenizer)
    vocab = backend.get_vocab(with_added_tokens=True)
    return max(vocab.values(), default=-1) + 1


def check_fits(tokenizer, model) -> None:
    """An OptionsError naming tokenizer, in one line with both sizes, when `tokenizer` can emit an id that
    `model` (a model or its ModelConfig) has no embedding for."""
    size = getattr(model, "config", model).vocab_size
    ids = id_count(tokenizer)
    if ids > size:
        raise OptionsError(f"the tokenizer does not fit the model: it has {ids} ids (0..{ids - 1}) but the "
                         f"model's vocabulary only {size} (vocab_size={size}), so ids {size}..{ids - 1} have "
                         f"no embedding; use the model's own tokenizer", "tokenizer")
