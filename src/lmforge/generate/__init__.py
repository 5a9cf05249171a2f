"""Text generation for decoders and encoder-decoders with a KV cache.

Greedy decoding, temperature sampling, top-k (Fan et al. 2018), nucleus / top-p
(Holtzman et al. 2020), beam search (beam.py) and the logit processors of processors.py
(repetition penalty, n-gram blocking, minimum length, forced first/last tokens); stop
tokens, a budget of new tokens and left-padded batches. Decoders return prompt + new
tokens; encoder-decoders return the decoder's tokens, starting with the decoder start
token — the same shapes the reference library's `generate` returns.
"""
from __future__ import annotations

from typing import Callable, Optional, Union

import torch

from lmforge.fast.accelerate import accelerate
from lmforge.generate.beam import Beams, beam_search
from lmforge.generate.checks import check_options, check_prompt, special_ids
from lmforge.generate.fast.projection import VocabProjection
from lmforge.generate.processors import Constraints
from lmforge.generate.sampling import Sampling, argmax_rows, next_tokens
from lmforge.generate.steps import DecoderSteps, EncoderDecoderSteps, lm_head_name
from lmforge.model import EncoderDecoder, Transformer

__all__ = ["Sampling", "argmax_rows", "generate", "lm_head_name", "next_tokens"]


class _Finished:
    """Which rows have produced a stop token; later positions of those rows get `pad`."""

    def __init__(self, stop: Optional[torch.Tensor], pad: Optional[int], n: int, device) -> None:
        self.stop, self.pad = stop, pad
        self.done = torch.zeros(n, dtype=torch.bool, device=device)

    def mark(self, chosen: torch.Tensor) -> torch.Tensor:
        """(N,) chosen tokens with finished rows padded; the rows that stop now are noted."""
        if self.stop is None:
            return chosen
        chosen = torch.where(self.done, torch.full_like(chosen, self.pad), chosen)
        self.done |= torch.isin(chosen, self.stop)
        return chosen


def _choose(steps, constraints, rule, generator) -> torch.Tensor:
    """(N,) next tokens: the projection's own argmax (a screen) where no processor changes this step's
    scores and decoding is greedy, else from the processed logits."""
    features = steps.lm.features(steps.hidden())
    if not rule.do_sample and constraints.inert(steps.tokens.shape[1]):
        chosen = steps.projection.argmax(features)
        if chosen is not None:
            return chosen
    logits = steps.projection.logits(features)
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
    if isinstance(model, EncoderDecoder):
        if prefix_lm:
            raise ValueError("prefix_lm is for decoders: an encoder-decoder's encoder already reads the "
                             "input bidirectionally")
        return EncoderDecoderSteps(model, lm, input_ids, mask, ids["start"], copies, use_cache, projection)
    return DecoderSteps(model, lm, input_ids.repeat_interleave(copies, 0), mask.repeat_interleave(copies, 0),
                        use_cache, prefix_lm, projection)


def _decode(steps, ids: dict, rule: Sampling, beams: Beams, options: dict, generator, streamer):
    """Run beam search or greedy / sampled decoding over `steps`."""
    prompt_len, max_new_tokens = steps.tokens.shape[1], options["max_new_tokens"]
    padding = (steps.mask == 0).sum(1) if not isinstance(steps, EncoderDecoderSteps) else None
    constraints = Constraints(prompt_len, prompt_len + max_new_tokens, ids["eos"], options["repetition_penalty"],
                              padding, options["no_repeat_ngram_size"], options["min_length"],
                              options["min_new_tokens"], ids["bos"], ids["forced_eos"], ids["suppress"])
    if beams.num_beams > 1:
        # the reference fills short hypotheses with pad, or eos where pad is unset or 0
        fill = ids["pad"] if ids["pad"] else int(ids["eos"][0]) if ids["eos"] is not None else -1
        return beam_search(steps, constraints, beams, ids["eos"], fill, max_new_tokens)
    steps.projection.greedy = not rule.do_sample and not constraints.always_active
    finished = _Finished(ids["eos"], ids["pad"], steps.tokens.shape[0], steps.tokens.device)
    return _sample(steps, constraints, rule, finished, max_new_tokens, generator, streamer)


@torch.no_grad()
def generate(model: Transformer, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor] = None, *,
             max_new_tokens: int = 20, do_sample: bool = False, temperature: float = 1.0, top_k: int = 0,
             top_p: float = 1.0, repetition_penalty: float = 1.0, num_beams: int = 1,
             length_penalty: float = 1.0, early_stopping: Union[bool, str] = False,
             num_return_sequences: int = 1, min_new_tokens: int = 0, min_length: int = 0,
             no_repeat_ngram_size: int = 0, forced_bos_token_id: Optional[int] = None,
             forced_eos_token_id: Optional[int] = None, suppress_tokens=None, eos_token_id=None,
             pad_token_id=None, decoder_start_token_id: Optional[int] = None, use_cache: bool = True,
             prefix_lm: bool = False, generator: Optional[torch.Generator] = None,
             streamer: Optional[Callable] = None, projection: str = "auto", accelerated: bool = True) -> torch.Tensor:
    """Continue `input_ids` (B, T), left-padded when `attention_mask` has zeros.

    Decoders return (B * R, T + n) prompt and new tokens; encoder-decoders return (B * R, 1 + n)
    decoder tokens (R = num_return_sequences; with beams the R best of each input, best first).
    Arguments mean what the reference library's `generate` arguments of the same names mean;
    stop, pad, forced and decoder start ids default to the model config's. use_cache=False
    recomputes every position at every step (same tokens, slower); prefix_lm=True lets a decoder
    pretrained as a prefix LM read the prompt bidirectionally (objectives/prefix_lm.py); `streamer`
    receives each step's (B * R,) new tokens (greedy and sampling only). Speed options, same tokens:
    `projection` computes the vocabulary projection "auto" (the fastest way timed on this machine),
    "plain", "input-major" or "screen" (generate/fast/projection.py); `accelerated` runs the model
    under fast.accelerate. The model is left exactly as it was found (weights, layout, mode)."""
    rule = Sampling(do_sample, temperature, top_k, top_p)
    beams = Beams(num_beams, length_penalty, early_stopping, num_return_sequences)
    mask = check_prompt(model, input_ids, attention_mask, max_new_tokens)
    ids = special_ids(model, eos_token_id, pad_token_id, decoder_start_token_id, forced_bos_token_id,
                      forced_eos_token_id, suppress_tokens)
    check_options(beams, rule, streamer, repetition_penalty, min_new_tokens, min_length, no_repeat_ngram_size)
    options = {"max_new_tokens": max_new_tokens, "repetition_penalty": repetition_penalty, "min_length": min_length,
               "no_repeat_ngram_size": no_repeat_ngram_size, "min_new_tokens": min_new_tokens}
    copies = num_beams if num_beams > 1 else num_return_sequences
    projection = VocabProjection(model.heads[lm_head_name(model)], projection, steps=max_new_tokens)
    modes = [(module, module.training) for module in model.modules()]  # each module's own, restored
    try:
        with accelerate(model.eval(), accelerated):
            steps = _steps(model, input_ids, mask, ids, copies, use_cache, prefix_lm, projection)
            return _decode(steps, ids, rule, beams, options, generator, streamer)
    finally:
        for module, training in modes:
            module.training = training
