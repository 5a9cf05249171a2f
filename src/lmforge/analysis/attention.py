"""Attention maps of any model, exactly as its kernels attended (for views and analyses).

The model runs its ordinary forward with an `Inspection` recording the chosen layers
(layers/inspection.py): each recorded layer's probabilities are recomputed from the q, k and
mask bias its kernel used, so sparse patterns (windows, dilation, Longformer's global rows,
BigBird's random blocks), GQA groups and position biases (ALiBi, T5, XL) are all in them.
"""
from __future__ import annotations

from typing import Optional

import torch

from lmforge.analysis.maps import AttentionGroup, AttentionMaps
from lmforge.config.options import OptionsError, checked_text
from lmforge.generate import generate
from lmforge.generate.text import tokenizer_ids
from lmforge.layers.inspection import inspecting
from lmforge.model import Transformer
from lmforge.utils.modes import evaluating
from lmforge.utils.errors import shown


def view_depth(model: Transformer) -> int:
    """How many layers a view may name: the encoder's, or an encoder-decoder's deeper stack's."""
    cfg = model.config
    return max(cfg.n_layers, cfg.decoder_layers if cfg.architecture == "encoder-decoder" else 0)


def layer_list(text: str, layers: int) -> list:
    """The sorted distinct layers that '0,3,5', '2-5' or both ('0,2-5') name, each below `layers`
    (checked before a range is made: 0-100000000 builds nothing); OptionsError (field "layers") for
    anything else: ASCII digits only (int() reads a fullwidth 1 as 1), no range run backwards, and at
    least one layer. The command line's --layers and the server's ?layers= read it alike."""
    chosen = set()
    for part in filter(str.strip, text.split(",")):
        low, dash, high = part.partition("-")
        first = _layer_index(low, layers, text)
        last = _layer_index(high, layers, text) if dash else first
        if last < first:
            raise OptionsError(f"{text[:100]!r}: the range {part.strip()} runs backwards", "layers")
        chosen.update(range(first, last + 1))
    if not chosen:
        raise OptionsError(f"{text[:100]!r} names no layer: expected indices like 0,3,5 or a range like 2-5",
                           "layers")
    return sorted(chosen)


def _layer_index(part: str, layers: int, text: str) -> int:
    part = part.strip()
    if not (part.isdigit() and part.isascii()):
        raise OptionsError(f"{text[:100]!r}: expected indices like 0,3,5 or a range like 2-5", "layers")
    index = int(part) if len(part) <= 6 else layers  # int() of a long numeral costs its length
    if index >= layers:
        raise OptionsError(f"{text[:100]!r}: {part[:20]} is not a layer of this model (0..{layers - 1})",
                           "layers")
    return index


def _layers(model: Transformer, layers) -> object:
    """'all' or a frozenset of layer indices, each checked against the model's depth."""
    if layers is None or layers == "all":
        return "all"
    if isinstance(layers, str):  # as --layers and ?layers= read it: "10" was layers 1 and 0, a digit each
        return frozenset(layer_list(layers, view_depth(model)))
    try:
        chosen = frozenset(int(i) for i in ([layers] if isinstance(layers, int) else layers))
    except (TypeError, ValueError):  # int(None): Python's words, naming nothing
        raise OptionsError(f"layers must be 'all', a layer index or a list of them, got {shown(layers)}",
                           "layers") from None
    depth = view_depth(model)
    bad = sorted(i for i in chosen if not 0 <= i < depth)
    if bad:
        # a list reaches here from Python alone (--layers and ?layers= are read by layer_list): the field
        raise OptionsError(f"layers {bad} outside the model's layers 0..{depth - 1}", "layers")
    return chosen


def _tokens(tokenizer, ids: list) -> list:
    return [tokenizer.id_to_token(int(i)) or f"<{int(i)}>" for i in ids]


def _group(name: str, records: dict, stack: str, kind: str, rows: list,
           cols: list) -> Optional[AttentionGroup]:
    """The group of `records` under (stack, kind, layer), batch row 0, keys expanded to each head."""
    entries = sorted((layer, rec) for (s, k, layer), rec in records.items() if s == stack and k == kind)
    if not entries:
        return None
    probs, queries, keys = [], [], []
    for _, rec in entries:
        H = rec.q.shape[1]
        probs.append(rec.probs[0].detach().float())
        queries.append(rec.q[0].detach().float())
        keys.append(rec.k[0].detach().float().repeat_interleave(H // rec.k.shape[1], dim=0))
    return AttentionGroup(name, rows, cols, [layer for layer, _ in entries], probs, queries, keys,
                          float(entries[0][1].scale))


def attention_maps(model: Transformer, tokenizer, text: str, pair: Optional[str] = None, layers=None,
                   max_new_tokens: int = 16) -> AttentionMaps:
    """The attention of every chosen layer on `text` (and `pair`): an encoder's or decoder's
    self-attention; for an encoder-decoder, encoder, decoder and cross attention, the decoder
    reading `pair` (or its own greedy continuation of `text` when no pair is given)."""
    _check_text("text", text, "the text to show attention for is empty")
    if pair is not None:  # else an empty segment B
        _check_text("pair", pair, "pair is empty: give the second text, or leave it out")  # cli: --pair
    chosen = _layers(model, layers)
    cfg = model.config
    seq2seq = cfg.architecture == "encoder-decoder"
    enc = tokenizer.encode(text, None if seq2seq else pair, max_length=cfg.max_seq_len)
    # what max_seq_len cut off, if anything
    total = len(tokenizer.encode(text, None if seq2seq else pair).ids)
    ids = torch.tensor([enc.ids])
    with evaluating(model), torch.no_grad():
        target = _decoder_inputs(model, tokenizer, ids, pair, max_new_tokens) if seq2seq else None
        with inspecting(model, record=chosen) as inspection:
            if seq2seq:
                model(ids, decoder_input_ids=target, run_heads=False)
            else:
                segments = torch.tensor([enc.segment_ids]) if cfg.n_segments >= 2 else None
                kw = {"segment_ids": segments} if cfg.architecture == "encoder" else {}
                model(ids, run_heads=False, **kw)
    maps = _maps(model, tokenizer, inspection.records, enc, target)
    if total > len(enc.ids):
        maps.meta.update(truncated=True, tokens_kept=len(enc.ids), tokens_total=total)
    return maps


def _check_text(name: str, text, empty: str) -> None:
    """An OptionsError naming `name` where `text` is no str, not UTF-8 (a lone surrogate: the tokenizer's
    error named nothing) or blank (`empty` says so)."""
    if not checked_text(text, name).strip():
        raise OptionsError(empty, name)


def _decoder_inputs(model, tokenizer, ids, pair, max_new_tokens: int) -> torch.Tensor:
    """(1, T') decoder inputs: the start token then `pair`'s tokens, or the greedy continuation; the ids the
    config lacks are the tokenizer's, as `lmforge generate` and /generate take them (tokenizer_ids: its pad
    starts the decoder, its eos ends the text), where this view refused a T5 that generate answered."""
    given = tokenizer_ids(model, tokenizer)
    if pair is None:
        return generate(model, ids, max_new_tokens=max_new_tokens, **given)
    start, pad = model.config.decoder_start_token_id, given.get("pad_token_id", model.config.pad_token_id)
    start = start if start is not None else (pad or 0)
    target = tokenizer.encode(pair, max_length=model.config.max_seq_len - 1).ids
    return torch.tensor([[start] + target])


def _maps(model, tokenizer, records: dict, enc, target) -> AttentionMaps:
    """AttentionMaps of the recorded layers, groups named for the architecture."""
    cfg = model.config
    source = _tokens(tokenizer, enc.ids)
    if target is None:
        stack = "decoder" if cfg.architecture == "decoder" else "encoder"
        groups = [_group("self", records, stack, "self", source, source)]
    else:
        decoded = _tokens(tokenizer, target[0].tolist())
        groups = [_group("encoder", records, "encoder", "self", source, source),
                  _group("decoder", records, "decoder", "self", decoded, decoded),
                  _group("cross", records, "decoder", "cross", decoded, source)]
    meta = {"architecture": cfg.architecture, "position": cfg.position, "attention": cfg.attention,
            "n_layers": cfg.n_layers, "n_heads": cfg.n_heads, "n_kv_heads": cfg.kv_heads}
    return AttentionMaps([g for g in groups if g is not None], title=cfg.source or cfg.architecture,
                         segments=list(enc.segment_ids), meta=meta)
