"""Contextual features of texts (bert-as-service's service, ELMo's features): the chosen hidden states of
every token, or one vector per text pooled from them, as FeatureOptions says (analysis/feature_options.py).

Each token comes with its id, its piece, the text it covers and that text's character offsets [start,
end) in the input (special tokens cover nothing: start == end). A text longer than the options' length
is refused, or cut with truncate (its answer says so). An encoder-decoder gives its encoder's states; a
decoder's see the left context only. ELMo reads whitespace-separated words: its tokens are the words
(id None), pooled alike (cls: the first word, sep: the last). SentencePiece's "▁" before a word covers
none of its characters (Metaspace gives it the word's first one, which the next piece covers).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from lmforge.analysis.feature_options import FeatureOptions
from lmforge.analysis.features import default_max_len, hidden_states
from lmforge.config.checks import room_for_text, within_context
from lmforge.config.options import OptionsError, checked_argument, checked_texts, named_keywords
from lmforge.fast.optimize import optimize
from lmforge.fast.paths import FastPaths
from lmforge.io.resolve import checked_tokenizer
from lmforge.pipelines.embed import MAX_BATCH_SIZE
from lmforge.utils.modes import evaluating

_WORD = re.compile(r"\S+")
_SPACE_MARK = "\u2581"  # SentencePiece's space, a piece of its own before a word it does not start


@dataclass
class TextFeatures:
    """One text's features: (L, T, d) per token, (L, d) pooled; L = 1 for a scalar mix."""

    tokens: list  # each {"id", "token", "text", "start", "end"}
    n_tokens: int  # tokens the model read (after any cut: at most max_length); the server counts the same
    truncated: bool  # whether the text was cut to max_length
    layers: list | str  # the hidden-state indices, or "mix"
    features: torch.Tensor

    def as_json(self, per_token: bool) -> dict:
        """Plain lists, as the server answers."""
        out = {"layers": self.layers, "n_tokens": self.n_tokens, "truncated": self.truncated,
               "features": self.features.tolist()}
        if per_token:
            out["tokens"] = self.tokens
        return out


def pool(hidden: torch.Tensor, pooling: str) -> torch.Tensor:
    """(L, n, d) states of one text's n real tokens -> (L, n, d) (none) or (L, d) (bert-as-service's
    REDUCE_MEAN, REDUCE_MAX, MEAN_MAX, CLS, SEP; last = sep)."""
    if pooling == "none":
        return hidden
    if pooling == "mean":
        return hidden.mean(1)
    if pooling == "max":
        return hidden.max(1).values
    if pooling == "mean_max":
        return torch.cat([hidden.mean(1), hidden.max(1).values], -1)
    if pooling == "cls":
        return hidden[:, 0]
    if pooling in ("sep", "last"):
        return hidden[:, -1]
    raise OptionsError(f"pooling={pooling!r} pools a word's pieces; a text's tokens take none, mean, max, "
                       "mean_max, cls, sep or last", "pooling")


def _tokens(tokenizer, text: str, encoding) -> list:
    out = []
    for i, (a, b) in zip(encoding.ids, encoding.offsets):
        token = tokenizer.id_to_token(i) or ""
        if token == _SPACE_MARK and not text[a:b].isspace():  # Metaspace's prepended "▁" (T5) is given the
            b = a  # first character of the word after it, which the next piece covers: it covers nothing
        out.append({"id": i, "token": token, "text": text[a:b], "start": a, "end": b})
    return out


def encode_text(tokenizer, text: str, limit: int, truncate: bool, index: int = 0) -> tuple:
    """(the encoding within `limit` tokens, the whole text's token count); a longer text is refused
    (naming truncate) unless `truncate`."""
    whole = tokenizer.encode(text)
    if len(whole.ids) <= limit:
        return whole, len(whole.ids)
    if not truncate:
        raise OptionsError(f"text {index} is {len(whole.ids)} tokens, more than max_length={limit}; "
                           "truncate=true cuts it", "truncate")
    return tokenizer.encode(text, max_length=limit), len(whole.ids)


def feature_texts(texts) -> list:
    """`texts` as checked_texts reads them, none blank: an empty or whitespace-only text has no token of its
    own (a decoder's tokenizer gives it none: its mean pooling was NaN, its cls an IndexError), so the
    library, `lmforge features --text` and POST /features refuse it alike, naming texts."""
    texts = checked_texts(texts)
    for i, text in enumerate(texts):
        if not text.strip():
            raise OptionsError(f"the text to take features of is empty (texts[{i}])", "texts")
    return texts


def _reduce(states: torch.Tensor, options: FeatureOptions, n_states: int) -> torch.Tensor:
    """(S, n, d) chosen states of one text -> the options' layers (mixed or not), pooled."""
    if options.mixed:
        weights, gamma = options.mix(n_states)
        states = gamma * (weights.to(states.dtype)[:, None, None] * states).sum(0, keepdim=True)
    return pool(states, options.pooling)


def text_features(model, tokenizer, texts: list, options: FeatureOptions | None = None,
                  batch_size: int = 32) -> list:
    """A TextFeatures per text (float32, on the CPU), in the order given."""
    options = options or FeatureOptions()
    texts = feature_texts(texts)
    if hasattr(model, "word_layers"):
        return _elmo_features(model, texts, options, batch_size)
    n_states = model.config.n_layers + 1
    chosen = options.chosen(n_states)
    limit = _limit(model, tokenizer, options.max_length)
    encoded = [encode_text(tokenizer, t, limit, options.truncate, i) for i, t in enumerate(texts)]
    device = next(model.parameters()).device
    out: list = [None] * len(texts)
    order = sorted(range(len(texts)), key=lambda i: len(encoded[i][0].ids))  # less padding a batch
    with evaluating(model), torch.no_grad():
        for start in range(0, len(order), batch_size):
            chunk = order[start:start + batch_size]
            hidden = hidden_states(model, *_batch([encoded[i][0] for i in chunk], tokenizer, device))
            hidden = hidden[chosen].float().cpu()  # (S, B, T, d)
            for b, i in enumerate(chunk):
                encoding, count = encoded[i]
                n = len(encoding.ids)
                out[i] = TextFeatures(_tokens(tokenizer, texts[i], encoding), n, count > n,
                                      "mix" if options.mixed else chosen,
                                      _reduce(hidden[:, b, :n], options, n_states))
    return out


def _limit(model, tokenizer, max_length: int | None) -> int:
    """The tokens a text may have: max_length, where the model reads that many positions and it leaves room
    for a token beside the special ones (else an OptionsError naming it), or the model's limit."""
    if max_length is None:
        return default_max_len(model, tokenizer)
    # past the positions the model failed naming neither; within the field's bound, 2 left no room for text
    room_for_text("max_length", max_length, model.config, tokenizer.backend.num_special_tokens_to_add(False))
    return max_length


def _batch(encodings: list, tokenizer, device) -> tuple:
    T = max(len(e.ids) for e in encodings)
    ids = torch.full((len(encodings), T), tokenizer.pad_id or 0, dtype=torch.long)
    segments, mask = torch.zeros_like(ids), torch.zeros_like(ids)
    for row, e in enumerate(encodings):
        n = len(e.ids)
        ids[row, :n], segments[row, :n], mask[row, :n] = torch.tensor(e.ids), torch.tensor(e.segment_ids), 1
    return ids.to(device), mask.to(device), segments.to(device)


def _elmo_features(model, texts: list, options: FeatureOptions, batch_size: int) -> list:
    """ELMo's features: its tokens are a text's whitespace-separated words (their offsets given), at most
    its max_seq_len a text, as a Transformer's tokens; batch_size texts a pass."""
    from lmforge.elmo import MAX_BATCH_SIZE

    within_context("max_length", options.max_length, model.config)  # the bound a Transformer's max_length has
    words = [list(_WORD.finditer(t)) for t in texts]
    limit = options.max_length or model.config.max_seq_len
    for i, found in enumerate(words):
        if not found:
            raise OptionsError(f"text {i} has no words (ELMo reads whitespace-separated words)", "texts")
        if len(found) > limit and not options.truncate:
            raise OptionsError(f"text {i} is {len(found)} words, more than max_length={limit}; send "
                               "truncate=true to cut it", "truncate")
    kept = [found[:limit] for found in words]
    # the batch only groups the passes (each text's layers are its own), so a larger one is run in parts
    layered = model.word_layers([[m.group() for m in found] for found in kept],
                                min(batch_size, MAX_BATCH_SIZE))
    n_states = layered[0].shape[0]
    chosen = options.chosen(n_states)
    return [TextFeatures([{"id": None, "token": m.group(), "text": m.group(), "start": m.start(),
                           "end": m.end()}
                          for m in found], len(found), len(whole) > len(found),
                         "mix" if options.mixed else chosen,
                         _reduce(states[chosen].float().cpu(), options, n_states))
            for whole, found, states in zip(words, kept, layered)]


def load_for_features(where) -> tuple:
    """(model, tokenizer) of a model directory (or installed package); ELMo reads characters: no tokenizer."""
    from lmforge.io import load
    from lmforge.io.resolve import find_model_dir
    from lmforge.tokenizer import load_tokenizer

    path = find_model_dir(where)
    # the features job runs the model optimized, as every job does, its weights read as frozen: it only
    # runs it (oneDNN's products on a copy packed once, fast/paths.py)
    model = optimize(load(path), paths=FastPaths.frozen())
    return model.eval(), (None if hasattr(model, "word_layers") else load_tokenizer(path))


@named_keywords("features")
def features(texts, model, tokenizer=None, options: FeatureOptions | None = None, *, layers=None,
             mix_weights=None, mix_gamma=None, pooling=None, max_length=None, truncate=None,
             batch_size: int = 32) -> list:
    """Contextual features of `texts` (a TextFeatures each): `options` with the named fields changed (see
    FeatureOptions); `model` is a model, a directory or an installed model package."""
    options = FeatureOptions.build(options, {"layers": layers, "mix_weights": mix_weights,
                                             "mix_gamma": mix_gamma, "pooling": pooling,
                                             "max_length": max_length, "truncate": truncate})
    batch_size = checked_argument("batch_size", "int", {"low": 1, "high": MAX_BATCH_SIZE}, batch_size)
    texts = feature_texts(texts)  # before the model is read
    tokenizer = checked_tokenizer(tokenizer)
    if not hasattr(model, "config"):
        model, found = load_for_features(model)
        tokenizer = tokenizer or found
    if tokenizer is None and not hasattr(model, "word_layers"):
        raise OptionsError("features(texts, model=<a model>) needs tokenizer=", "tokenizer")
    return text_features(model, tokenizer, texts, options, batch_size)
