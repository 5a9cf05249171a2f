"""Contextual word features: the hidden state of every word at every layer, for feature-based
transfer (Peters et al. 2018, ELMo; Devlin et al. 2019, sec. 5.3) and probing (Tenney et al. 2019).

A sentence is a list of words. Its words are joined by spaces and encoded as the tokenizer would
encode the text (tasks/tagging.py `align`), each token is mapped back to its word, and a word's
pieces are pooled into one vector per layer: "first" (BERT's NER features), "mean" or "last" (the
natural choice for a left-to-right decoder, whose last piece has read the whole word). Layer 0 is
the embedding output; an encoder-decoder gives its encoder's layers; a decoder's features see the
left context only. A model with its own `word_layers(sentences)` (ELMo) gives its layers directly.

A sentence longer than the model's max length is cut to the words whose pieces all fit: its
tensor has fewer words, and a TruncationWarning counts the sentences and words cut, never silently;
ELMo's sentences are cut so at its max_seq_len words.
"""
from __future__ import annotations

import hashlib
import json
import warnings
from itertools import pairwise
from pathlib import Path

import torch

from lmforge.analysis.feature_options import resolve_layers
from lmforge.config.options import OptionsError
from lmforge.tasks.tagging import align
from lmforge.utils.atomic import refuse_link
from lmforge.utils.modes import evaluating

POOLINGS = ("first", "mean", "last")
FEATURES_FILE = "features.safetensors"


class TruncationWarning(UserWarning):
    """Sentences longer than the model's max length were cut (the message counts them)."""


def parse_layers(spec, n_states: int) -> list:
    """Hidden-state indices (0 = embeddings .. n_states - 1) of a layer selection: an int (negative: from the
    top), "4", a range "4-8" (inclusive), a list "0,3,6", "all" or "mix" (all of them, mixed by the head);
    see feature_options.resolve_layers. A bad one is its OptionsError naming the field, layers (the command
    line says it as --layers: cli.analysis.feature_layers)."""
    return resolve_layers("all" if spec is None else spec, n_states)


def pool_words(hidden: torch.Tensor, word_ids: list, n_words: int, pooling: str = "first") -> torch.Tensor:
    """hidden (L, T, d) and each token's word (-1: none) -> (L, n_words, d), a word's pieces pooled;
    a word without pieces gets zeros."""
    if pooling not in POOLINGS:
        raise OptionsError(f"pooling {pooling!r} is not one of {', '.join(POOLINGS)}", "pooling")
    L, T, d = hidden.shape
    w = torch.tensor(word_ids[:T], dtype=torch.long)
    pos = torch.arange(len(w))
    keep = (w >= 0) & (w < n_words)
    w, pos = w[keep], pos[keep]
    out = hidden.new_zeros(L, n_words, d)
    count = torch.zeros(n_words).index_add_(0, w, torch.ones(len(w)))
    if pooling == "mean":
        out.index_add_(1, w, hidden[:, pos])
        return out / count.clamp(min=1).to(hidden.dtype)[None, :, None]
    reduce, fill = ("amin", T) if pooling == "first" else ("amax", -1)
    at = torch.full((n_words,), fill, dtype=torch.long).scatter_reduce(0, w, pos, reduce)
    has = count > 0
    out[:, has] = hidden[:, at[has]]
    return out


def encode_words(tokenizer, words: list, max_len: int) -> tuple:
    """(align's example for the words, how many leading words have all their pieces within max_len)."""
    full = align(tokenizer, words, None, [], None)
    if len(full["input_ids"]) <= max_len:
        return full, len(words)
    cut = align(tokenizer, words, None, [], max_len)
    counts = [torch.bincount(torch.tensor([w for w in e["word_ids"] if w >= 0], dtype=torch.long),
                             minlength=len(words)) for e in (full, cut)]
    differs = (counts[0] != counts[1]).nonzero()
    return cut, int(differs[0]) if len(differs) else len(words)


def hidden_states(model, ids: torch.Tensor, mask: torch.Tensor,
                  segments: torch.Tensor | None) -> torch.Tensor:
    """(L + 1, B, T, d): the embedding output and every layer's (an encoder-decoder's encoder)."""
    arch = model.config.architecture
    if arch == "encoder-decoder":
        out = model.encode(ids, mask, return_hidden=True)
    elif arch == "decoder":
        out = model(ids, mask, return_hidden=True, run_heads=False)
    else:
        out = model(ids, mask, segment_ids=segments, return_hidden=True, run_heads=False)
    return torch.stack(out.hidden_states)


def _batch(examples: list, pad_id: int, device) -> tuple:
    T = max(len(e["input_ids"]) for e in examples)
    ids = torch.full((len(examples), T), pad_id, dtype=torch.long)
    segments, mask = torch.zeros_like(ids), torch.zeros_like(ids)
    for i, e in enumerate(examples):
        n = len(e["input_ids"])
        ids[i, :n], segments[i, :n], mask[i, :n] = (torch.tensor(e["input_ids"]),
                                                    torch.tensor(e["segment_ids"] or [0] * n), 1)
    return ids.to(device), mask.to(device), segments.to(device)


def _warn_cut(sentences: list, kept: list, max_len: int, stats: dict | None, stacklevel: int = 3) -> None:
    cut = [(len(s), k) for s, k in zip(sentences, kept) if k < len(s)]
    dropped = sum(n - k for n, k in cut)
    if stats is not None:
        stats.update(truncated_sentences=len(cut), dropped_words=dropped)
    if cut:
        warnings.warn(f"{len(cut)} of {len(sentences)} sentences exceed max_len={max_len} tokens: cut to the "
                      f"words that fit ({dropped} words dropped)", TruncationWarning, stacklevel=stacklevel)


def default_max_len(model, tokenizer) -> int:
    """The model's max_seq_len, or the tokenizer's model_max_length where that is smaller."""
    limit = getattr(tokenizer, "model_max_length", None) or model.config.max_seq_len
    return min(model.config.max_seq_len, limit)


def word_features(model, tokenizer, sentences: list, layers=None, pooling: str = "first",
                  batch_size: int = 32, max_len: int | None = None, stats: dict | None = None) -> list:
    """Per sentence (a list of words), a (n_layers_chosen, n_words, d) float32 CPU tensor of the chosen
    hidden states (default all: embeddings + every layer); stats, if given, gets the truncation counts."""
    if pooling not in POOLINGS:
        raise OptionsError(f"pooling {pooling!r} is not one of {', '.join(POOLINGS)}", "pooling")
    if not sentences or any(not s for s in sentences):
        raise ValueError("word_features needs sentences of at least one word each")
    if hasattr(model, "word_layers") and max_len is not None:  # else it would be ignored
        raise ValueError(f"max_len={max_len}: ELMo reads whole words, with no token limit to set")
    if hasattr(model, "word_layers"):  # ELMo: its own character CNN + biLSTM layers, per word already
        return _elmo_features(model, sentences, layers, batch_size, stats)
    if max_len is not None and not 3 <= max_len <= model.config.max_seq_len:  # [CLS] a word [SEP]
        raise ValueError(f"max_len must be >= 3 and <= the model's max_seq_len={model.config.max_seq_len}, "
                         f"got {max_len}")
    max_len = max_len or default_max_len(model, tokenizer)
    encoded = [encode_words(tokenizer, list(words), max_len) for words in sentences]
    _warn_cut(sentences, [k for _, k in encoded], max_len, stats)
    pick = parse_layers(layers, model.config.n_layers + 1)
    device = next(model.parameters()).device
    order = sorted(range(len(sentences)), key=lambda i: len(encoded[i][0]["input_ids"]))  # less padding
    out: list = [None] * len(sentences)
    with evaluating(model), torch.no_grad():
        for start in range(0, len(order), batch_size):
            chunk = order[start: start + batch_size]
            hidden = hidden_states(model, *_batch([encoded[i][0] for i in chunk], tokenizer.pad_id or 0,
                                                  device))[pick].float().cpu()  # (L, B, T, d)
            for b, i in enumerate(chunk):
                example, kept = encoded[i]
                out[i] = pool_words(hidden[:, b], example["word_ids"], kept, pooling)
    return out


def _elmo_features(model, sentences: list, layers, batch_size: int, stats: dict | None) -> list:
    """ELMo's own layers of each sentence's words, batch_size sentences a pass; a sentence past the model's
    max_seq_len words is cut to them and counted, as a Transformer's past its max length."""
    from lmforge.elmo import MAX_BATCH_SIZE

    pick = parse_layers(layers, model.config.n_layers + 1)  # a bad selection fails before the model runs
    limit = model.config.max_seq_len
    kept = [min(len(words), limit) for words in sentences]
    _warn_cut(sentences, kept, limit, stats, stacklevel=4)  # the warning points at word_features' caller
    # the batch only groups the passes (each sentence's layers are its own), so a larger one is run in parts
    layered = model.word_layers([list(words)[:k] for words, k in zip(sentences, kept)],
                                min(batch_size, MAX_BATCH_SIZE))
    return [f[pick].float().cpu() for f in layered]


def save_features(path, features: list, meta: dict) -> Path:
    """Write features (a list of (L, n_words, d) tensors) as DIR/features.safetensors: "features"
    (L, all words, d) and "offsets" (n_sentences + 1,), with `meta` as JSON in the file's metadata."""
    from lmforge.io.files import save_tensors

    path = refuse_link(path)  # a folder reached through a link is never written into
    path.mkdir(parents=True, exist_ok=True)
    offsets = torch.tensor([0] + [f.shape[1] for f in features]).cumsum(0)
    flat, text = torch.cat(features, dim=1), json.dumps(meta)
    save_tensors({"features": flat, "offsets": offsets}, path / FEATURES_FILE,
                 {"meta": text, "sha256": _digest(flat, offsets, text)})
    return path / FEATURES_FILE


def _digest(flat: torch.Tensor, offsets: torch.Tensor, meta: str) -> str:
    """sha256 of the features, their offsets and the meta text, as save_features stores them."""
    digest = hashlib.sha256(meta.encode())
    for tensor in (flat, offsets):
        digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def load_features(file) -> tuple:
    """(list of (L, n_words, d) tensors, meta) of a file written by save_features, verified against the
    checksum it stores (one written before reads unverified): a damaged file is a CheckpointError naming
    it."""
    from safetensors import SafetensorError, safe_open

    from lmforge.io.files import CheckpointError, describe_read_error

    try:
        with safe_open(str(file), framework="pt") as f:
            stored = f.metadata() or {}
            flat, offsets = f.get_tensor("features"), f.get_tensor("offsets")
        meta = json.loads(stored.get("meta", "{}"))
    except (SafetensorError, OSError, ValueError) as err:
        raise CheckpointError(describe_read_error(file, err)) from None
    want = stored.get("sha256")
    if want is not None and want != _digest(flat, offsets, stored.get("meta", "{}")):
        raise CheckpointError(f"{file} does not match its checksum (changed or damaged since it was written)")
    return [flat[:, a:b] for a, b in pairwise(offsets.tolist())], meta
