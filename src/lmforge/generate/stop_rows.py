"""lmforge.generate's stop strings (`stop_strings=` with `tokenizer=`, the reference library's names): each
row of a batch ends at the step its new text holds one, by the rule `lmforge generate --stop` and the
server's `stop` follow (generate/stop_rule.py: check_stops checks them, a TextTail a row seeks them), so a
row's ids are those generate_until_stop gives its prompt alone. A row keeps its ids up to and including the
one that completed a stop string, as the reference keeps them (the ids are not cut inside that token's
text), its later positions padded as after a stop token; beam search's returned hypotheses are cut after,
as generate_until_stop cuts its best one."""
from __future__ import annotations

from collections.abc import Callable

import torch

from lmforge.generate.options import GenerationOptions
from lmforge.generate.stop_rule import TextTail, check_stops
from lmforge.utils.errors import OptionsError


def until_eos(ids: list, eos) -> list:
    """Beam output up to and including its first stop token (later positions are filler)."""
    stops = eos if isinstance(eos, list) else [eos]
    hit = next((i for i, t in enumerate(ids) if t in stops), None)
    return ids if hit is None else ids[:hit + 1]


class StopRows:
    """Each returned row's new text (a TextTail), and which rows a stop string has ended; with `show` (one
    row: generate_until_stop's), each step's text newly safe to show goes to show(text, token_ids)."""

    def __init__(self, tails: list, show: Callable | None = None) -> None:
        self.tails, self.show = tails, show

    def ended(self, chosen: torch.Tensor, done: torch.Tensor) -> torch.Tensor:
        """(N,) whether each row's text holds a stop string once this step's (N,) `chosen` ids are added to
        the rows not `done` before it (a finished row's padding is no text of its own)."""
        for tail, token, finished in zip(self.tails, chosen.tolist(), done.tolist()):
            if finished:
                continue
            if self.show is None:
                tail.seek(token)  # nothing is shown: push's hold-back (held, at every step) would be waste
            else:
                self.show(tail.push(token), [token])
        return torch.tensor([tail.stopped for tail in self.tails], device=chosen.device)

    def for_call(self, input_ids, mask, options: GenerationOptions, pad, encoder_decoder: bool) -> StopRows:
        """This StopRows as a call's rows (lmforge.generate._generate's route, as stop_rows makes them; its
        stop strings checked by its caller): one TextTail a returned row, else an OptionsError naming
        input_ids or num_return_sequences (zip would pair the first tails only, all rows ending with one),
        or naming pad_token_id as stop_rows does (_check_pad)."""
        prompts, each = input_ids.shape[0], options.num_return_sequences
        if prompts * each != len(self.tails):
            raise OptionsError(f"{prompts} prompts x {each} sequences each are {prompts * each} rows for a "
                               f"StopRows of {len(self.tails)} (one TextTail a returned row)",
                               "input_ids" if prompts != len(self.tails) else "num_return_sequences")
        _check_pad(prompts * each, options, pad)  # else a row that ended first went on unpadded (_Finished)
        return self

    def cut(self, out: torch.Tensor, start: int, eos, fill: int) -> torch.Tensor:
        """Beam search's (N, L) `out` with each row's new ids (from column `start`) cut after the one whose
        text holds a stop string, its later positions `fill`, and the columns that no row keeps left out."""
        stop_ids = None if eos is None else eos.tolist()
        kept = [tail.feed(until_eos(row[start:].tolist(), stop_ids)) for tail, row in zip(self.tails, out)]
        out = out[:, :start + max(map(len, kept))].clone()
        for row, ids in enumerate(kept):
            out[row, start + len(ids):] = fill
        return out


def stop_rows(stop_strings, tokenizer, input_ids, mask, options: GenerationOptions, pad,
              encoder_decoder: bool) -> StopRows | None:
    """The StopRows of a call's returned rows (each input's num_return_sequences in turn), None without stop
    strings: a decoder's new ids join their prompt's (its padding left out), an encoder-decoder's answer
    starts a text of its own. An OptionsError naming what is wrong: stop_strings (check_stops), a tokenizer
    missing, or a pad token missing for the rows of a greedy or sampled batch that end first (check_stops'
    messages begin with the field: "stop_strings.1: a stop string is empty ...")). A StopRows of the
    caller's own (generate_until_stop's) goes in by StopRows.for_call instead."""
    if stop_strings is not None and not isinstance(stop_strings, (str, list, tuple)):  # a StopRows: for_call
        raise OptionsError(f"stop_strings must be a str or a list of str, got {type(stop_strings).__name__}",
                           "stop_strings")
    try:
        stops = check_stops(stop_strings, field="stop_strings")
    except OptionsError as err:  # the rule's words name no face's argument: --stop's are prefixed with the
        err.args = (f"{err.field}: {err}",)  # flag, the server's carry the param; here, the argument
        raise
    if not stops:
        return None
    if not callable(getattr(tokenizer, "decode", None)):
        got = "none was given" if tokenizer is None else f"{type(tokenizer).__name__} has no decode"
        raise OptionsError(f"stop_strings are sought in the decoded text: give tokenizer= (the model's); "
                           f"{got}", "tokenizer")
    _check_pad(input_ids.shape[0] * options.num_return_sequences, options, pad)
    contexts = [[] if encoder_decoder else row[keep.bool()].tolist() for row, keep in zip(input_ids, mask)]
    each = options.num_return_sequences
    return StopRows([TextTail(tokenizer, stops, context) for context in contexts for _ in range(each)])


def _check_pad(rows: int, options: GenerationOptions, pad) -> None:
    """An OptionsError naming pad_token_id where a greedy or sampled call of more than one row has no pad
    token for the rows that end first (stop_rows' and StopRows.for_call's rule)."""
    if options.num_beams == 1 and rows > 1 and pad is None:
        raise OptionsError(f"stop_strings with {rows} rows need a pad token for the rows that end first: "
                           "give pad_token_id (the model config names no pad or eos token)", "pad_token_id")
