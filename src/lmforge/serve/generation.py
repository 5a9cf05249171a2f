"""Generation jobs: lmforge.generate with a streamer that turns each new token into text, cuts at
stop strings, and an early end.

The text of a growing list of ids is decoded whole each step (decoding piece by piece loses
WordPiece joins and splits multi-byte characters, as cli/generate.py's TextStream says), and the
part that could still become a stop string or an incomplete character is held back, so a
streamed text never shows what the final text does not. Beam search cannot stream (its best
hypothesis is known only at the end): its stop strings cut the finished text.

Cancellation is not here: the worker stops a job between any two forward passes of its model
(worker.py), which for generation is between two decoding steps.
"""
from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from lmforge.generate import generate


class StopText(Exception):
    """Raised from the streamer when a stop string has appeared: generation ends there."""


@dataclass
class Settings:
    """The decoding settings of one request (generate()'s arguments of the same names)."""

    max_new_tokens: int = 40
    temperature: float = 0.0  # 0: greedy; > 0: sampling
    top_k: int = 0
    top_p: float = 1.0
    num_beams: int = 1
    length_penalty: float = 1.0
    repetition_penalty: float = 1.0
    no_repeat_ngram_size: int = 0
    min_new_tokens: int = 0
    seed: int | None = None  # sampling: a fixed seed gives the same text again
    stop: tuple = field(default_factory=tuple)


def prompt_ids(tokenizer, model, text: str) -> list:
    """The prompt's ids as `lmforge generate` makes them: an encoder-decoder's encoder reads the text
    with its template (T5: text </s>), a decoder continues the bare text."""
    return tokenizer.encode(text, add_special_tokens=model.config.architecture == "encoder-decoder").ids


def _held(text: str, stops: tuple) -> int:
    """Characters at the end of `text` that begin some stop string (they may yet complete it)."""
    longest = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:n]):
                longest = n
                break
    return longest


class TextTail:
    """The text of the ids generated so far: what may be shown, and whether a stop string appeared."""

    def __init__(self, tokenizer, stops: tuple) -> None:
        self.tokenizer, self.stops = tokenizer, tuple(s for s in stops if s)
        self.ids, self.shown, self.text, self.stopped = [], "", "", False

    def push(self, token: int) -> str:
        """Add one id; returns the text newly safe to show (maybe "")."""
        self.ids.append(token)
        text = self.tokenizer.decode(self.ids)
        cut = min((i for i in (text.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            self.stopped, text = True, text[:cut]
        self.text = text
        if not text.startswith(self.shown):  # a join changed earlier text: wait until it settles
            return ""
        safe = len(text) if self.stopped else len(text) - _held(text, self.stops)
        if not self.stopped and text.endswith("\ufffd"):  # half a character
            safe = min(safe, len(text) - 1)
        delta = text[len(self.shown):max(safe, len(self.shown))]
        self.shown += delta
        return delta

    def rest(self) -> str:
        """The text not yet shown, once generation is over."""
        return self.text[len(self.shown):] if self.text.startswith(self.shown) else ""


def _options(settings: Settings, model, tokenizer) -> dict:
    cfg = model.config
    eos = cfg.eos_token_id if cfg.eos_token_id is not None else tokenizer.eos_id
    sampling = settings.temperature > 0
    seed = settings.seed if settings.seed is not None else int.from_bytes(os.urandom(4), "little")
    return {"max_new_tokens": settings.max_new_tokens, "do_sample": sampling,
            "temperature": settings.temperature if sampling else 1.0, "top_k": settings.top_k,
            "top_p": settings.top_p, "num_beams": settings.num_beams,
            "length_penalty": settings.length_penalty,
            "repetition_penalty": settings.repetition_penalty,
            "no_repeat_ngram_size": settings.no_repeat_ngram_size, "min_new_tokens": settings.min_new_tokens,
            "eos_token_id": eos, "generator": torch.Generator().manual_seed(seed) if sampling else None}


def _finish(ids: list, eos, stopped: bool, max_new: int) -> str:
    if stopped or (eos is not None and ids and ids[-1] in (eos if isinstance(eos, list) else [eos])):
        return "stop"
    return "length" if len(ids) >= max_new else "stop"


def run(served, payload: dict, emit: Callable) -> dict:
    """Generate for one prompt; `emit` receives {"text", "token_ids"} per new token (num_beams 1).
    Returns the whole result: text, token ids, finish reason and token counts."""
    model, tokenizer, settings = served.model, served.tokenizer, payload["settings"]
    ids = torch.tensor([payload["ids"]])
    tail, options = TextTail(tokenizer, settings.stop), _options(settings, model, tokenizer)

    def streamer(chosen: torch.Tensor) -> None:
        token = int(chosen[0])
        emit({"text": tail.push(token), "token_ids": [token]})
        if tail.stopped:
            raise StopText

    beams = settings.num_beams > 1
    try:
        out = generate(model, ids, **options, streamer=None if beams else streamer)
        new = out[0, 1 if model.config.architecture == "encoder-decoder" else ids.shape[1]:].tolist()
    except StopText:
        new = tail.ids
    if beams:
        new = _until_eos(new, options["eos_token_id"])
        for token in new:
            tail.push(token)
            if tail.stopped:
                break
    elif not tail.stopped and tail.rest():
        emit({"text": tail.rest(), "token_ids": []})
    reason = _finish(new, options["eos_token_id"], tail.stopped, settings.max_new_tokens)
    return {"text": tail.text, "token_ids": new, "finish_reason": reason,
            "usage": {"prompt_tokens": ids.shape[1], "completion_tokens": len(new),
                      "total_tokens": ids.shape[1] + len(new)}}


def _until_eos(ids: list, eos) -> list:
    """Beam output up to and including its first stop token (later positions are filler)."""
    stops = eos if isinstance(eos, list) else [eos]
    hit = next((i for i, t in enumerate(ids) if t in stops), None)
    return ids if hit is None else ids[:hit + 1]
