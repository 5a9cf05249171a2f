"""Checks of a generation request against the model, before any model call: the prompt, and the options'
vocabulary and context (the options' own types, bounds and mixes are GenerationOptions's)."""
from __future__ import annotations

import warnings
from typing import Optional

import torch

from lmforge.config.options import OptionsError, checked_seed
from lmforge.generate.call_options import checked_call_value
from lmforge.generate.options import MAX_SEQUENCES, OFF, GenerationOptions, GenerationWarning
from lmforge.model import EncoderDecoder, Transformer


def check_call(model, use_cache, prefix_lm, generator, streamer, projection: str = "auto", seed=None):
    """Refuse generate's arguments beside the options and the prompt, before any model call: a model that
    is not a Transformer (a directory's name failed as "'str' object has no attribute 'config'"), a
    use_cache or prefix_lm that is not a bool (prefix_lm="no" read the prompt bidirectionally) or a projection
    that is not one of MODES (each as CallOptions declares it), prefix_lm for an encoder-decoder, a generator
    that is not a torch.Generator or a streamer that cannot be called (both failed mid-decoding), a bad seed
    (seeded): an OptionsError naming each. Returns the sampling generator (seeded's)."""
    if not isinstance(getattr(model, "_orig_mod", model), Transformer):  # torch.compile's wrapper: its model
        raise OptionsError(f"model must be a Transformer (lmforge.load(DIR) reads a directory), got "
                           f"{type(model).__name__}", "model")
    for name, value in (("use_cache", use_cache), ("prefix_lm", prefix_lm), ("projection", projection)):
        checked_call_value(name, value)  # as CallOptions declares it, as the command line and server read it
    check_prefix_lm(model, prefix_lm)
    if generator is not None and not isinstance(generator, torch.Generator):
        raise OptionsError(f"generator must be a torch.Generator, got {type(generator).__name__}",
                           "generator")
    if streamer is not None and not callable(streamer):
        raise OptionsError(f"streamer must be callable (it is given each step's new tokens), got "
                           f"{type(streamer).__name__}", "streamer")
    return seeded(model, seed, generator)


def seeded(model, seed, generator):
    """The sampling generator: `generator`, else (`seed` given) a torch.Generator seeded with it as
    `lmforge generate --seed` and the server's seed seed theirs (on the model's device: on a CPU, their
    tokens); seed is bounded as --seed is (MAX_SEED), and refused with a generator: an OptionsError."""
    if seed is None:
        return generator
    if generator is not None:  # two sources of the draws: which one was meant is not known
        raise OptionsError("seed and generator were both given: give one (seed=N seeds a generator as "
                           "`lmforge generate --seed N` does)", "seed")
    seed = checked_seed(seed)
    return torch.Generator(device=model.tokens.weight.device).manual_seed(seed)


def check_prefix_lm(model, prefix_lm: bool) -> None:
    """Refuse prefix_lm for an encoder-decoder (an OptionsError naming it), in every face before any work."""
    if prefix_lm and isinstance(getattr(model, "_orig_mod", model), EncoderDecoder):
        raise OptionsError("prefix_lm is for decoders: an encoder-decoder's encoder already reads the input "
                           "bidirectionally", "prefix_lm")


def check_prompt(model: Transformer, input_ids, attention_mask) -> torch.Tensor:
    """Refuse a request the model cannot serve before any model call, naming the argument; the (B, T) mask."""
    if model.config.architecture == "encoder":
        why = ("lmforge does not decode XLNet's permutation LM (the reference's generate feeds it a "
               "perm_mask a step)" if model.config.position == "xl-relative" else
               "an encoder with an MLM head fills masks instead (lmforge.fill_mask)")
        raise OptionsError(f"generation needs a decoder or an encoder-decoder; {why}", "model")
    # int64 or int32, as the embedding reads them (a bool or uint8 tensor failed inside it)
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 \
            or input_ids.dtype not in (torch.int64, torch.int32):
        shape = (f"{tuple(input_ids.shape)} {input_ids.dtype}" if isinstance(input_ids, torch.Tensor)
                 else type(input_ids).__name__)
        raise OptionsError(f"input_ids must be a tensor of token ids (int64 or int32) of shape (batch, "
                           f"length), got {shape}", "input_ids")
    B, T = input_ids.shape
    if B == 0 or T == 0:
        raise OptionsError("the prompt is empty: generation needs at least one token per row", "input_ids")
    if attention_mask is not None and (not isinstance(attention_mask, torch.Tensor)
                                       or not bool(((attention_mask == 0) | (attention_mask == 1)).all())):
        # 2 and 0.5 were read as long: 2 a token, 0.5 padding
        raise OptionsError("attention_mask must be a tensor of 0 (padding) and 1 (a token)", "attention_mask")
    mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask.long()
    if tuple(mask.shape) != (B, T):
        raise OptionsError(f"attention_mask of shape {tuple(mask.shape)} does not match input_ids {(B, T)}",
                           "attention_mask")
    if not bool(mask.any(1).all()):
        row = int((~mask.any(1)).nonzero()[0])
        raise OptionsError(f"row {row} of the prompt is empty (its attention mask is 0)", "attention_mask")
    cfg = model.config
    low, high = int(input_ids.min()), int(input_ids.max())
    if low < 0 or high >= cfg.vocab_size:
        raise OptionsError(f"the prompt holds token id {low if low < 0 else high} outside the vocabulary "
                           f"[0, {cfg.vocab_size})", "input_ids")
    if T > cfg.max_seq_len:
        raise OptionsError(f"the prompt of {T} tokens is longer than the context, "
                           f"max_seq_len={cfg.max_seq_len}", "input_ids")
    if not isinstance(model, EncoderDecoder) and not bool(mask[:, -1].all()):
        raise OptionsError("the prompt is right-padded: a decoder continues each row's last position, so pad "
                           "on the left", "attention_mask")
    return mask


def check_for_model(options: GenerationOptions, model: Transformer, start: int) -> dict:
    """Refuse options this model cannot serve (top_k beyond its vocabulary, ids outside it, more new tokens
    than its context leaves after `start` decoder positions, a min_length they cannot reach); returns the
    special ids (see special_ids)."""
    cfg = model.config
    options.check_start(start)
    if options.top_k > cfg.vocab_size:
        raise OptionsError(f"top_k={options.top_k} is more than the vocabulary, vocab_size={cfg.vocab_size}",
                           "top_k")
    if start + options.max_new_tokens - 1 > cfg.max_seq_len:  # the last new token is never fed back
        raise OptionsError(f"{start} starting tokens plus max_new_tokens={options.max_new_tokens} exceed the "
                           f"context, max_seq_len={cfg.max_seq_len}", "max_new_tokens")
    return special_ids(model, options)


def _token_ids(value, name: str, vocab_size: Optional[int], device) -> Optional[torch.Tensor]:
    """An id or a list of ids as a (n,) tensor, each in [0, vocab_size) unless vocab_size is None."""
    if value is None:
        return None
    ids = [value] if isinstance(value, int) else list(value)
    limit = float("inf") if vocab_size is None else vocab_size
    if not ids or any(not isinstance(i, int) or not 0 <= i < limit for i in ids):
        raise OptionsError(f"{name}={value!r} must be token ids in [0, {vocab_size})", name)
    return torch.tensor(ids, dtype=torch.long, device=device)


def special_ids(model, options: GenerationOptions) -> dict:
    """Stop, pad, start, forced and suppressed ids: the options', else the model config's; a forced id of
    OFF (-1) or a suppress_tokens of [] is none, the config's overridden. A config's stop id outside the
    vocabulary is kept, as the reference keeps it: it is never produced."""
    cfg, device, V = model.config, model.tokens.weight.device, model.config.vocab_size
    eos = options.eos_token_id
    out = {"eos": _token_ids(cfg.eos_token_id if eos is None else eos, "eos_token_id",
                             None if eos is None else V, device),
           "suppress": _token_ids(options.suppress_tokens or None, "suppress_tokens", V, device)}
    # ids fed to the model (pad: after a row's stop) or indexing the scores must be in the vocabulary
    for key, name in (("pad", "pad_token_id"), ("start", "decoder_start_token_id"),
                      ("bos", "forced_bos_token_id"), ("forced_eos", "forced_eos_token_id")):
        given = getattr(options, name)
        value = getattr(cfg, name) if given is None else None if given == OFF else given
        ids = _token_ids(value, name, V, device)
        out[key] = None if ids is None else int(ids[0])
    _refuse_forced_and_suppressed(out, options)
    if out["pad"] is None and out["eos"] is not None:
        out["pad"] = int(out["eos"][0])  # finished rows need a filler; the reference uses eos too
    if isinstance(model, EncoderDecoder) and out["start"] is None:
        out["start"] = _start_from_pad(options, cfg)
    return out


def _refuse_forced_and_suppressed(ids: dict, options: GenerationOptions) -> None:
    """OptionsError naming a forced token (the options' or the config's) that suppress_tokens also bans: every
    score of that step is then -inf, and greedy decoding took token 0, unsaid (the reference refuses it)."""
    if ids["suppress"] is None:
        return
    banned = set(ids["suppress"].tolist())
    for key, name in (("bos", "forced_bos_token_id"), ("forced_eos", "forced_eos_token_id")):
        if ids[key] in banned:
            given = getattr(options, name) is not None
            whose, advice = ("", "remove it from one of them") if given else \
                (" (the model config's)", "the config forces it, so leave it out of suppress_tokens")
            raise OptionsError(f"{name}={ids[key]}{whose} is also in suppress_tokens: no token could be "
                               f"chosen at the forced position; {advice}", name)


def _start_from_pad(options: GenerationOptions, cfg) -> int:
    """An encoder-decoder's first decoder token where neither the options nor the config name one: its pad
    token, as T5 starts (said in a warning); an OptionsError naming decoder_start_token_id without one."""
    pad = options.pad_token_id if options.pad_token_id is not None else cfg.pad_token_id
    if pad is None:
        raise OptionsError("an encoder-decoder's decoder needs its first token: the config names no "
                           "decoder_start_token_id and no pad token to start from; give "
                           "decoder_start_token_id (an option, or in the model's config.json)",
                           "decoder_start_token_id")
    warnings.warn(f"the decoder starts from the pad token (id {pad}), as T5 does: the config names no "
                  "decoder_start_token_id", GenerationWarning)  # one place: said once, however many calls
    return int(pad)


def check_streamed(options: GenerationOptions, streamer) -> None:
    """Refuse a streamer with beam search (an OptionsError naming num_beams): its tokens come at the end."""
    if options.num_beams > 1 and streamer is not None:
        raise OptionsError(f"num_beams={options.num_beams} with a streamer: beam search knows its best "
                           "hypothesis only at the end; give num_beams=1 to stream", "num_beams")


def sequences_each(prompts: int, options: GenerationOptions) -> int:
    """The sequences each of `prompts` rows runs (its beams, or its returned sequences); an OptionsError
    naming input_ids where that is more than MAX_SEQUENCES at once, before any model call."""
    copies = options.num_beams if options.num_beams > 1 else options.num_return_sequences
    if prompts * copies > MAX_SEQUENCES:
        raise OptionsError(f"{prompts} prompts x {copies} sequences each is {prompts * copies} sequences at "
                           f"once, more than {MAX_SEQUENCES}: give fewer prompts a call", "input_ids")
    return copies
