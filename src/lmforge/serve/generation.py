"""Generation jobs: lmforge.generate for one prompt, its text cut at the request's stop strings (and
generation ended there), streamed as it grows, with its finish reason and token counts.

The stop strings' rule (the text decoded whole each step, cut at the first stop string, what could still
become one or half a character held back, greedy and sampling ended at the step one appears, beam search's
text cut after) is generate/stops.py's, which `lmforge generate --stop` follows too.

Cancellation is not here: the worker stops a job between any two forward passes of its model
(worker.py), which for generation is between two decoding steps.
"""
from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from lmforge.config.options import OptionsError
from lmforge.generate.options import GenerationOptions, sampling_from_temperature
from lmforge.generate.recommended import resolve
from lmforge.generate.stops import TextTail, generate_until_stop
from lmforge.generate.text import tokenizer_ids
from lmforge.serve.limits import RequestError


@dataclass
class Settings:
    """The decoding settings of one request: the GenerationOptions fields it gave (`given`; temperature
    decides sampling: 0 greedy, > 0 samples), its route's own defaults (`defaults`, beneath the served
    model's recommended settings), a seed, stop strings, whether it streams and whether a prefix LM reads the
    prompt. Each prompt's options are built by `options_for`, as lmforge.generate and the command line build
    theirs (generate/recommended.py): the request's values over the checkpoint's over the defaults. Building
    it checks the request's own values together, so the server refuses what the other faces refuse: a 422
    naming the field."""

    given: dict = field(default_factory=dict)
    defaults: dict = field(default_factory=dict)
    seed: int | None = None  # sampling: a fixed seed gives the same text again
    stop: tuple = field(default_factory=tuple)
    stream: bool = False
    new_tokens: str = "max_new_tokens"  # the route's name of max_new_tokens (/v1/completions: max_tokens)
    # a seed without sampling: refused as the command line refuses it, but where the route is OpenAI's, which
    # accepts it (lm-eval-harness sends seed with temperature 0); the reply's seed is null either way
    unsampled_seed: bool = False
    prefix_lm: bool = False  # lmforge.generate's argument (CallOptions): read the prompt bidirectionally

    def __post_init__(self) -> None:
        self.given = sampling_from_temperature(self.given)
        try:
            GenerationOptions.build(None, self.given)  # the request's own values, before any model work
        except OptionsError as err:
            raise self.refusal(err) from None

    def refusal(self, err: OptionsError, where: str | None = None) -> RequestError:
        """The client's 422 of `err`, in the route's names: a refusal on /v1/completions says max_tokens, the
        field it takes, not max_new_tokens, which it refuses (advice to give max_new_tokens was refused)."""
        said, field = str(err), err.field
        if where:  # the served model's directory, which the server tells no client (/info says names)
            said = said.replace(where + os.sep, "the served model's ").replace(where, "the served model")
        if self.new_tokens != "max_new_tokens":
            said = re.sub(r"\bmax_new_tokens\b", self.new_tokens, said)
            field = self.new_tokens if field == "max_new_tokens" else field
        return RequestError(422, said, param=field)

    def options_for(self, model, tokenizer, start: int, where: str | None = None) -> GenerationOptions:
        """The options of a prompt with `start` decoder positions before its new tokens, with the stop id
        always set (the finish reason and the cut at the stop read it from the options); `where`: the model's
        directory, not said in a refusal of its generation_config.json."""
        ids = {"eos_token_id": model.config.eos_token_id, **tokenizer_ids(model, tokenizer)}
        try:
            return resolve(model, start, self.given, defaults={**ids, **self.defaults})
        except OptionsError as err:
            raise self.refusal(err, where) from None


def _generator(settings: Settings, options: GenerationOptions) -> tuple:
    """(the sampling generator, its seed): the request's seed, else one drawn at random and sent back so
    the text can be had again; (None, None) where nothing is sampled."""
    if not options.do_sample:
        return None, None
    seed = settings.seed if settings.seed is not None else int.from_bytes(os.urandom(4), "little")
    return torch.Generator().manual_seed(seed), seed


def _finish(ids: list, eos, stopped: bool, max_new: int) -> str:
    if stopped or (eos is not None and ids and ids[-1] in (eos if isinstance(eos, list) else [eos])):
        return "stop"
    return "length" if len(ids) >= max_new else "stop"


def run(served, payload: dict, emit: Callable) -> dict:
    """Generate for one prompt; `emit` receives {"text", "token_ids"} per new token (num_beams 1).
    Returns the whole result: text, token ids, finish reason and token counts."""
    model, tokenizer = served.model, served.tokenizer
    settings, options = payload["settings"], payload["options"]  # options: the prompt's own (streaming._job)
    ids = torch.tensor([payload["ids"]])
    context = [] if model.config.architecture == "encoder-decoder" else payload["ids"]  # the new text's join
    tail = TextTail(tokenizer, settings.stop, context)
    generator, seed = _generator(settings, options)
    # a reply not streamed shows nothing per step: without stop strings its text is decoded once, at the end
    show = (lambda text, token_ids: emit({"text": text, "token_ids": token_ids})) if settings.stream else None
    try:
        new = generate_until_stop(model, ids, tail, options=options, prefix_lm=settings.prefix_lm,
                                  generator=generator, show=show)
    except OptionsError as err:  # a setting this model cannot serve (its vocabulary, its context)
        raise settings.refusal(err) from None
    reason = _finish(new, options.eos_token_id, tail.stopped, options.max_new_tokens)
    return {"text": tail.text, "token_ids": new, "finish_reason": reason, "seed": seed,
            "usage": {"prompt_tokens": ids.shape[1], "completion_tokens": len(new),
                      "total_tokens": ids.shape[1] + len(new)}}
