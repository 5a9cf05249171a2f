"""Text generation for decoders and encoder-decoders with a KV cache.

Greedy decoding, temperature sampling, top-k (Fan et al. 2018), nucleus / top-p
(Holtzman et al. 2020), beam search (beam.py) and the logit processors of processors.py
(repetition penalty, n-gram blocking, minimum length, forced first/last tokens); stop
tokens, a budget of new tokens and left-padded batches. Decoders return prompt + new
tokens; encoder-decoders return the decoder's tokens, starting with the decoder start
token — the same shapes the reference library's `generate` returns.
"""
from __future__ import annotations

from contextlib import contextmanager
from functools import partial
from typing import Callable, Optional

import torch

from lmforge.generate.beam import Beams, beam_search
from lmforge.generate.call_options import CALL_FIELDS
from lmforge.generate.checks import check_call, check_for_model, check_prompt, check_streamed, sequences_each
from lmforge.generate.vocab.projection import VocabProjection
from lmforge.generate.options import GenerationOptions, refuse_unused
from lmforge.generate.processors import Constraints
from lmforge.generate.recommended import attach, keep, resolve
from lmforge.generate.sampling import Sampling, argmax_rows, next_tokens
from lmforge.generate.stop_rows import StopRows, stop_rows
from lmforge.generate.steps import DecoderSteps, EncoderDecoderSteps, lm_head_name
from lmforge.io import register_side_files
from lmforge.model import EncoderDecoder, Transformer

register_side_files(attach, keep)  # load(DIR) keeps DIR's recommended settings on the model; save writes them

__all__ = ["GenerationOptions", "Sampling", "argmax_rows", "generate", "lm_head_name", "next_tokens"]


class _Finished:
    """Which rows have produced a stop token, or (`texts`) a stop string; later positions of those rows
    get `pad`."""

    def __init__(self, stop: Optional[torch.Tensor], pad: Optional[int], n: int, device,
                 texts: Optional[StopRows] = None) -> None:
        self.stop, self.pad, self.texts = stop, pad, texts
        self.done = torch.zeros(n, dtype=torch.bool, device=device)

    def mark(self, chosen: torch.Tensor) -> torch.Tensor:
        """(N,) chosen tokens with finished rows padded; the rows that stop now are noted."""
        if self.stop is None and self.texts is None:
            return chosen
        # pad is none only for one row with stop strings and no eos or pad id (stop_rows and StopRows.for_call
        # refuse more rows: _check_pad): decoding ends once that row is done, so it is never padded
        if self.pad is not None:
            chosen = torch.where(self.done, torch.full_like(chosen, self.pad), chosen)
        before = self.done
        if self.stop is not None:
            self.done = before | torch.isin(chosen, self.stop)
        if self.texts is not None:  # a stop token is text too, as generate_until_stop reads it
            self.done = self.done | self.texts.ended(chosen, before)
        return chosen


def _choose(steps, constraints, rule, generator) -> torch.Tensor:
    """(N,) next tokens: the projection's own argmax (a screen) where no processor changes this step's
    scores and decoding is greedy, else from the processed logits."""
    features = steps.lm.features(steps.hidden())
    if not rule.do_sample and constraints.inert(steps.tokens.shape[1]):
        chosen = steps.projection.argmax(features)
        if chosen is not None:
            return chosen
    # the processors run in float32, as the reference's do: a half-precision model's penalised scores
    # rounded to its dtype moved sampling probabilities by up to 0.01
    logits = steps.projection.logits(features).float()
    return next_tokens(constraints(logits, steps.tokens), rule, generator)


def _sample(steps, constraints, rule, finished, max_new_tokens, generator, streamer) -> torch.Tensor:
    """Greedy decoding or sampling, one token per row per step."""
    for _ in range(max_new_tokens):
        chosen = finished.mark(_choose(steps, constraints, rule, generator))
        steps.append(chosen)
        if streamer is not None:
            streamer(chosen)
        if bool(finished.done.all()):
            break
    return steps.tokens


def _steps(model, input_ids, mask, ids: dict, copies: int, use_cache: bool, prefix_lm: bool,
           projection: VocabProjection):
    """The forward passes of this call: an encoder-decoder's decoder, or a decoder."""
    lm = model.heads[lm_head_name(model)]
    if isinstance(model, EncoderDecoder):  # prefix_lm=True refused for it by check_call
        return EncoderDecoderSteps(model, lm, input_ids, mask, ids["start"], copies, use_cache, projection)
    return DecoderSteps(model, lm, input_ids.repeat_interleave(copies, 0), mask.repeat_interleave(copies, 0),
                        use_cache, prefix_lm, projection)


def _decode(steps, ids: dict, options: GenerationOptions, generator, streamer, texts: Optional[StopRows]):
    """Run beam search or greedy / sampled decoding over `steps`, rows ending at `texts`' stop strings."""
    prompt_len, max_new_tokens = steps.tokens.shape[1], options.max_new_tokens
    rule = Sampling(options.do_sample, options.temperature, options.top_k, options.top_p)
    beams = Beams(options.num_beams, options.length_penalty, options.early_stopping,
                  options.num_return_sequences)
    padding = (steps.mask == 0).sum(1) if not isinstance(steps, EncoderDecoderSteps) else None
    constraints = Constraints(prompt_len, prompt_len + max_new_tokens, ids["eos"], options.repetition_penalty,
                              padding, options.no_repeat_ngram_size, options.min_length,
                              options.min_new_tokens or 0, ids["bos"], ids["forced_eos"], ids["suppress"])
    if beams.num_beams > 1:
        # the reference fills short hypotheses with pad, or eos where pad is unset or 0
        fill = ids["pad"] if ids["pad"] else int(ids["eos"][0]) if ids["eos"] is not None else -1
        out = beam_search(steps, constraints, beams, ids["eos"], fill, max_new_tokens)
        return out if texts is None else texts.cut(out, prompt_len, ids["eos"], fill)
    steps.projection.greedy = not rule.do_sample and not constraints.always_active
    finished = _Finished(ids["eos"], ids["pad"], steps.tokens.shape[0], steps.tokens.device, texts)
    return _sample(steps, constraints, rule, finished, max_new_tokens, generator, streamer)


@contextmanager
def _as_found(model):
    """The model in eval mode for the call; each module's own mode restored after it."""
    modes = [(module, module.training) for module in model.modules()]
    try:
        yield model.eval()
    finally:
        for module, training in modes:
            module.training = training


def generate(model: Transformer, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor] = None, *,
             options: Optional[GenerationOptions] = None, generator: Optional[torch.Generator] = None,
             seed: Optional[int] = None, streamer: Optional[Callable] = None, stop_strings=None,
             tokenizer=None, **fields) -> torch.Tensor:
    """Continue `input_ids` (B, T), left-padded when `attention_mask` has zeros.

    Decoders return (B * R, T + n) prompt and new tokens; encoder-decoders return (B * R, 1 + n) decoder
    tokens (R = num_return_sequences; with beams the R best of each input, best first). The decoding settings
    are a GenerationOptions: `options`, else the settings the model's directory recommends
    (`model.generation_config`, read by lmforge.load: its generation_config.json), else the defaults, with any
    of its fields given as keyword arguments over them (max_new_tokens=20, do_sample=True, num_beams=4, ...:
    the reference library's `generate` arguments of the same names); a bad or unknown one raises OptionsError
    (a ValueError) naming it. Stop, pad, forced and decoder start ids default to the model config's.
    `stop_strings` (a string or a list, with the `tokenizer` that decodes the model's ids: the reference's
    names) end each row at the step its new text holds one, as `--stop` does: ids kept up to the one
    completing it, later ones padded (beams: cut). Sampling draws from `generator`, or one seeded with `seed`
    (0 to 2**63 - 1) as `lmforge generate --seed` seeds its own (on a CPU, its tokens), not both; `streamer`
    receives each step's (B * R,) new tokens (greedy and sampling only). Keywords too, as CallOptions declares
    them (generate/call_options.py): prefix_lm=True lets a decoder pretrained as a prefix LM read the prompt
    bidirectionally (objectives/prefix_lm.py); speed settings, same tokens: use_cache=False recomputes every
    position at every step, `projection` computes the vocabulary projection "auto" (the fastest way timed on
    this machine), "plain", "input-major" or "screen" (generate/vocab/projection.py). The model runs as it is
    given: plain, or accelerated where `lmforge.optimize(model)` was called (the same tokens either way, but
    where two logits are equal within float rounding). It is left exactly as it was found (weights, layout,
    mode)."""
    return _generate(model, input_ids, attention_mask, partial(stop_rows, stop_strings, tokenizer),
                     options=options, generator=generator, seed=seed, streamer=streamer, **fields)


@torch.no_grad()
def _generate(model, input_ids, attention_mask, rows: Callable, /, *, options=None, generator=None, seed=None,
              streamer=None, **fields) -> torch.Tensor:
    """lmforge.generate, its rows ending where `rows(input_ids, mask, options, pad, encoder_decoder)`'s
    StopRows (or None) says: the stop strings' (stop_rows), or generate_until_stop's own (StopRows.for_call).
    The CallOptions keywords are split out of `fields` by name, the rest are GenerationOptions'."""
    call = {name: fields.pop(name, declared.default) for name, declared in CALL_FIELDS.items()}
    generator = check_call(model, call["use_cache"], call["prefix_lm"], generator, streamer,
                           call["projection"], seed)
    mask = check_prompt(model, input_ids, attention_mask)
    start = 1 if isinstance(model, EncoderDecoder) else input_ids.shape[1]  # positions before the new ones
    options = resolve(model, start, fields, options)
    refuse_unused(options, fields, seed)  # what the caller gave: the base's fields may be a checkpoint's
    ids = check_for_model(options, model, start)
    check_streamed(options, streamer)
    copies = sequences_each(input_ids.shape[0], options)
    texts = rows(input_ids, mask, options, ids["pad"], isinstance(model, EncoderDecoder))
    projection = VocabProjection(model.heads[lm_head_name(model)], call["projection"],
                                 steps=options.max_new_tokens)
    with _as_found(model) as found:
        steps = _steps(found, input_ids, mask, ids, copies, call["use_cache"], call["prefix_lm"], projection)
        return _decode(steps, ids, options, generator, streamer, texts)
