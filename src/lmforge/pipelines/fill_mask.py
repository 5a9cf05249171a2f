"""Filling a masked word: the top-k completions of one mask, with their probabilities.

Encoders with a masked-LM head (BERT, RoBERTa, ...) score every vocabulary entry at the mask
position (Devlin et al. 2019, sec. 3.1). The encoder-decoders fill by generation: T5 writes
the mask as its first sentinel and generates the span up to the next one (Raffel et al.
2020, sec. 3.1.4); BART reads its mask token and rewrites the whole sentence with the gap
filled (Lewis et al. 2020, sec. 2.2, text infilling). Their candidates are the hypotheses of
a beam search, each scored by the probability of its generated tokens.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

import torch

from lmforge.config.options import OptionsError, check_options, named_keywords, option, with_changes
from lmforge.generate import generate, lm_head_name
from lmforge.generate.options import MAX_BEAMS, MAX_NEW_TOKENS
from lmforge.io import find_model_dir, load, model_dir
from lmforge.io.resolve import checked_tokenizer
from lmforge.model import EncoderDecoder, Transformer
from lmforge.tokenizer import load_tokenizer
from lmforge.tokenizer.fits import check_fits
from lmforge.tokenizer.wrapper import as_text
from lmforge.utils.modes import evaluating

# a token's candidates are the vocabulary's rows (none of ours reaches this); a span's are beams, fewer
MAX_TOP_K = 100_000
MAX_SPAN = MAX_NEW_TOKENS - 2  # a T5 span's beams also generate its opening and closing sentinels
MASK_SPELLINGS = ("[MASK]", "<mask>")  # what a user may write for the mask, whatever the tokenizer's
SENTINEL, NEXT_SENTINEL = "<extra_id_0>", "<extra_id_1>"  # T5's first two span sentinels


@dataclass
class Candidate:
    """One completion: what fills the mask, its probability and the whole filled text."""

    token: str
    score: float
    sequence: str
    token_id: Optional[int] = None  # encoders: the vocabulary id put at the mask


@dataclass(frozen=True)
class FillOptions:
    """How many fillings of the mask, and how long a T5 / BART filling may be: one object for fill_mask,
    `lmforge fill-mask` and POST /fill_mask."""

    top_k: int = option(5, "candidates returned (T5 / BART: at most their 64 beams)", low=1, high=MAX_TOP_K)
    max_span: int = option(10, "T5 / BART: most tokens generated for the mask", low=1, high=MAX_SPAN)

    def __post_init__(self) -> None:
        check_options(self)


def check_fill(top_k, max_span, from_text: bool = False) -> tuple:
    """(top_k, max_span) as FillOptions reads them (a numpy number as Python's, a whole 3.0 as 3; from_text:
    a command line's "3.0" alike); an OptionsError naming either outside [1, MAX_TOP_K] / [1, MAX_SPAN]."""
    options = with_changes(FillOptions, None, {"top_k": top_k, "max_span": max_span}, "fill_mask", from_text)
    return options.top_k, options.max_span


@named_keywords("fill_mask")
@torch.no_grad()
def fill_mask(model, tokenizer=None, text: str | None = None, top_k: int = 5, max_span: int = 10) -> list:
    """The top_k candidates (most probable first) for the one mask ([MASK] or <mask>) in `text`.

    Encoders need a masked-LM head; T5-style encoder-decoders (a tokenizer with <extra_id_0>)
    generate a span of at most `max_span` tokens, BART-style ones the whole sentence. `model`: a
    Transformer with its `tokenizer`, or a model directory or installed model name (its own tokenizer
    unless one is given): fill_mask("DIR", text="a [MASK]"), or fill_mask(model, tokenizer, "a [MASK]")."""
    top_k, max_span = check_fill(top_k, max_span)
    check_text(tokenizer, text)
    model, tokenizer = _model_and_tokenizer(model, tokenizer)
    check_fits(tokenizer, model)  # else a candidate id past the tokenizer's prints as "[776]"
    if not any(h.spec["kind"] == "lm" for h in model.heads.values()):
        raise OptionsError("fill-mask needs the model's masked-LM head ('lm'): load a *ForMaskedLM or "
                           "*ForConditionalGeneration checkpoint, or one pretrained with an MLM objective",
                           "model")
    head = lm_head_name(model)
    with evaluating(model):
        if not isinstance(model, EncoderDecoder):
            if model.config.architecture != "encoder":
                raise OptionsError("fill-mask needs an encoder with a masked-LM head or an encoder-decoder "
                                   "(T5, BART); a decoder only continues text", "model")
            return _fill_token(model, tokenizer, head, text, top_k)
        if top_k > MAX_BEAMS:  # a span's or a sentence's candidates are beam search's hypotheses
            raise OptionsError(f"top_k={top_k}: an encoder-decoder's fillings are beams, at most {MAX_BEAMS}",
                               "top_k")
        if tokenizer.token_to_id(SENTINEL) is not None:
            return _fill_span(model, tokenizer, text, top_k, max_span)
        return _fill_sentence(model, tokenizer, text, top_k, max_span)


def check_text(tokenizer, text) -> None:
    """An OptionsError naming the argument where `text` is not given or is no text (checked_text's rule; UTF-8
    bytes taken, as the tokenizer takes them): a tokenizer argument that is no folder or installed model but
    holds a mask is the text given in its place (fill_mask(DIR, "a [MASK]"))."""
    if isinstance(tokenizer, str) and any(m in tokenizer for m in (*MASK_SPELLINGS, SENTINEL)) \
            and model_dir(tokenizer) is None:
        raise OptionsError(f"tokenizer {tokenizer[:40]!r} holds a mask, so it reads as the text: pass it as "
                           f"text= (fill_mask(model, text=...)), or in order: model, tokenizer (or None), "
                           f"text", "tokenizer")
    if text is None:
        raise OptionsError("fill_mask needs the text holding the mask: fill_mask(model, text=...)", "text")
    as_text(text)  # text=5 or a lone surrogate: the tokenizer's own check, an OptionsError naming text


def _model_and_tokenizer(model, tokenizer) -> tuple:
    """fill_mask's model and tokenizer: a Transformer as given (its tokenizer required), or the model and
    tokenizer of a directory or installed model name, as embed and rerank read them."""
    tokenizer = checked_tokenizer(tokenizer)
    if isinstance(model, (str, os.PathLike)):
        where = find_model_dir(model)
        return load(where), tokenizer if tokenizer is not None else load_tokenizer(where)
    if not isinstance(model, Transformer):
        raise OptionsError(f"fill_mask takes a Transformer, a model directory or an installed model's name, "
                           f"got {type(model).__name__}", "model")
    if tokenizer is None:
        raise OptionsError("fill_mask(model=<Transformer>, ...) needs its tokenizer (or name the model's "
                           "directory)", "tokenizer")
    return model, tokenizer


def with_mask(text, token: str) -> str:
    """`text` with every spelling of the mask written as `token`; an error unless there is exactly one."""
    text = as_text(text)
    for spelling in MASK_SPELLINGS:
        if spelling != token:
            text = text.replace(spelling, token)
    if text.count(token) != 1:  # the model's own token too where it is another (T5's <extra_id_0>)
        said = " or ".join(dict.fromkeys((*MASK_SPELLINGS, token)))
        raise OptionsError(f"the text must hold exactly one mask ({said}), found {text.count(token)}", "text")
    return text


def _mask_token(tokenizer) -> str:
    token = tokenizer.special_tokens.get("mask")
    if token is None or tokenizer.token_to_id(token) is None:
        raise OptionsError("the tokenizer has no mask token", "tokenizer")
    return token


def _fill_token(model, tokenizer, head: str, text: str, top_k: int) -> list:
    """An encoder's distribution over the vocabulary at the mask."""
    mask = _mask_token(tokenizer)
    enc = tokenizer.encode(with_mask(text, mask))
    ids = torch.tensor([enc.ids], device=model.tokens.weight.device)
    _check_length(model, ids.shape[1])
    at = enc.ids.index(tokenizer.token_to_id(mask))
    segments = torch.tensor([enc.segment_ids], device=ids.device) if model.config.n_segments else None
    hidden = model(ids, segment_ids=segments, run_heads=False).last_hidden_state[0, at]  # (d_model,)
    probs = model.heads[head](hidden[None]).float().softmax(-1)[0]  # (V,)
    best = probs.topk(min(top_k, probs.shape[0]))
    out = []
    for p, i in zip(best.values.tolist(), best.indices.tolist()):
        filled = enc.ids[:at] + [i] + enc.ids[at + 1:]
        # its text, as the reference pipeline's token_str: a byte-level vocabulary's entry reads "Ġriver"
        token = tokenizer.decode([i], skip_special_tokens=False) or tokenizer.id_to_token(i) or f"[{i}]"
        out.append(Candidate(token, p, tokenizer.decode(filled), i))
    return out


def _check_length(model, T: int) -> None:
    if T > model.config.max_seq_len:
        raise OptionsError(f"the text is {T} tokens long, more than the context, "
                           f"max_seq_len={model.config.max_seq_len}", "text")


def _beams(model, ids, top_k: int, max_new_tokens: int, **options) -> torch.Tensor:
    """The top_k hypotheses of a beam search ranked by plain log-probability (no length penalty)."""
    ranked = {"length_penalty": 0.0} if top_k > 1 else {}  # one beam is greedy: nothing to rank
    return generate(model, ids, max_new_tokens=max_new_tokens, num_beams=top_k, num_return_sequences=top_k,
                    **ranked, **options)


def sequence_log_probs(model, ids, decoded, stop: torch.Tensor, skip: int = 0) -> torch.Tensor:
    """(R,) log-probability of each row of `decoded` (R, L) given the encoder input `ids` (1, S): its
    tokens after the start token (and `skip` more) up to and including the first stop token."""
    R = decoded.shape[0]
    logits = model(ids.expand(R, -1), decoder_input_ids=decoded[:, :-1]).logits.float()
    new = decoded[:, 1:]  # (R, L - 1) the tokens each position predicts
    logp = logits.log_softmax(-1).gather(-1, new[..., None]).squeeze(-1)
    is_stop = torch.isin(new, stop).long()
    alive = (is_stop.cumsum(1) - is_stop) == 0  # up to and including the first stop
    alive[:, :skip] = False
    return (logp.double() * alive).sum(1)  # float64: a long random sentence underflows float32's exp


def _fill_span(model, tokenizer, text: str, top_k: int, max_span: int) -> list:
    """T5: generate <extra_id_0> span <extra_id_1>; the probability is of the span and its end."""
    ids = torch.tensor([tokenizer.encode(with_mask(text, SENTINEL)).ids], device=model.tokens.weight.device)
    _check_length(model, ids.shape[1])
    first, after = tokenizer.token_to_id(SENTINEL), tokenizer.token_to_id(NEXT_SENTINEL)
    eos = model.config.eos_token_id if model.config.eos_token_id is not None else tokenizer.eos_id
    stop = [i for i in (after, eos) if i is not None]
    start = model.config.decoder_start_token_id
    # the span, its sentinel and its end, within the decoder's context after its start token: max_span is
    # a most, as in BART's sentence below, so a model with a short context writes what fits
    max_new = min(max_span + 2, model.config.max_seq_len - 1)
    decoded = _beams(model, ids, top_k, max_new, forced_bos_token_id=first, eos_token_id=stop,
                     decoder_start_token_id=tokenizer.pad_id if start is None else start)
    scores = sequence_log_probs(model, ids, decoded, torch.tensor(stop, device=ids.device), skip=1).exp()
    out = []
    for row, p in zip(decoded.tolist(), scores.tolist()):
        span = row[2:]  # after the start token and the forced sentinel
        span = span[:min((span.index(s) for s in stop if s in span), default=len(span))]
        filled = tokenizer.decode(span).strip()
        out.append(Candidate(filled, p, text_with(text, filled)))
    return sorted(out, key=lambda c: -c.score)


def text_with(text: str, filled: str) -> str:
    """The user's text with its mask (any spelling) replaced by `filled`."""
    for spelling in (*MASK_SPELLINGS, SENTINEL):
        text = text.replace(spelling, filled)
    return text


def _fill_sentence(model, tokenizer, text: str, top_k: int, max_span: int) -> list:
    """BART: rewrite the sentence with the gap filled; the probability is of the whole output."""
    mask = _mask_token(tokenizer)
    masked = with_mask(text, mask)
    ids = torch.tensor([tokenizer.encode(masked).ids], device=model.tokens.weight.device)
    _check_length(model, ids.shape[1])
    cfg = model.config
    eos = cfg.eos_token_id if cfg.eos_token_id is not None else tokenizer.eos_id
    if eos is None:
        raise ValueError("the model config and the tokenizer name no eos token to end the sentence")
    # BART's decoder starts with eos
    start = cfg.decoder_start_token_id if cfg.decoder_start_token_id is not None else eos
    max_new = min(ids.shape[1] + max_span, cfg.max_seq_len - 1, MAX_NEW_TOKENS)  # after the start token
    decoded = _beams(model, ids, top_k, max_new, eos_token_id=eos, decoder_start_token_id=start)
    skip = int(cfg.forced_bos_token_id is not None)  # a forced bos has no probability of its own
    scores = sequence_log_probs(model, ids, decoded, torch.tensor([eos], device=ids.device), skip).exp()
    before, after = (part.strip() for part in masked.split(mask))
    out = []
    for row, p in zip(decoded.tolist(), scores.tolist()):
        sentence = tokenizer.decode(row).strip()
        gap = sentence
        fits = len(sentence) >= len(before) + len(after)
        if fits and sentence.startswith(before) and sentence.endswith(after):
            gap = sentence[len(before):len(sentence) - len(after)].strip()
        out.append(Candidate(gap, p, sentence))
    return sorted(out, key=lambda c: -c.score)
