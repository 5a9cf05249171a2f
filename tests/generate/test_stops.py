"""Stop strings, one rule (generate/stops.py): checked alike for the command line and the server, the text
cut before the first of them, a possible beginning of one held back while streaming, and greedy generation
ended at the step one appears."""
from __future__ import annotations

import pytest
import torch

import lmforge
from lmforge.config.options import OptionsError
from lmforge.generate.options import GenerationOptions
from lmforge.generate.stops import (MAX_STOP, MAX_STOP_CHARS, StopLimitError, TextTail, check_stops,
                                    generate_until_stop)
from lmforge.generate.text import continuation
from tests.tasks.core import tokenizer


class Chars:
    """A tokenizer whose ids are characters."""

    def decode(self, ids):
        return "".join(chr(i) for i in ids)


def test_text_tail_holds_back_a_possible_stop_string_and_cuts_at_it():
    tail = TextTail(Chars(), ("END",))
    shown = [tail.push(ord(c)) for c in "abcENxEND!"]
    assert shown == ["a", "b", "c", "", "", "ENx", "", "", "", ""]
    assert tail.stopped and tail.text == "abcENx" and "".join(shown) == tail.text


def test_finished_ids_are_cut_at_the_one_whose_text_holds_a_stop_string():
    tail = TextTail(Chars(), ("cd", "x"))
    assert tail.feed([ord(c) for c in "abcdef"]) == [ord(c) for c in "abcd"]
    assert tail.stopped and tail.text == "ab"
    whole = TextTail(Chars())
    assert whole.feed([ord(c) for c in "abc"]) == [97, 98, 99] and whole.text == "abc" and not whole.stopped


def test_check_stops_takes_a_string_or_a_list_within_the_bounds():
    assert check_stops(None) == () and check_stops([]) == ()
    assert check_stops("\n") == ("\n",)
    assert check_stops(["a"] * MAX_STOP) == ("a",) * MAX_STOP
    assert check_stops(["x" * MAX_STOP_CHARS]) == ("x" * MAX_STOP_CHARS,)


@pytest.mark.parametrize("stop, field", [("", "stop"), (["a", ""], "stop.1"), ([""], "stop.0"),
                                         (["a", 5], "stop.1")])
def test_an_empty_or_non_string_stop_is_refused_naming_which(stop, field):
    with pytest.raises(OptionsError) as err:
        check_stops(stop)
    assert err.value.field == field and not isinstance(err.value, StopLimitError)
    assert "\n" not in str(err.value) and "stop string" in str(err.value)


@pytest.mark.parametrize("stop, limit, said", [
    (["a"] * (MAX_STOP + 1), "max_stop", f"{MAX_STOP + 1} stop strings, more than the {MAX_STOP} allowed"),
    (["a", "x" * (MAX_STOP_CHARS + 1)], "max_stop_chars",
     f"a stop string of {MAX_STOP_CHARS + 1} characters, more than the {MAX_STOP_CHARS} allowed")])
def test_stops_past_a_bound_are_refused_in_one_wording_naming_the_bound(stop, limit, said):
    """One wording for every face: the bound as a number (the command line has no max_stop setting; the
    server adds its setting's name), no second wording beside it."""
    with pytest.raises(StopLimitError) as err:
        check_stops(stop, field="stop_strings")
    assert err.value.limit == limit and str(err.value) == said and err.value.field == "stop_strings"
    assert not hasattr(err.value, "plain")
    check_stops(stop, max_stop=len(stop), max_chars=MAX_STOP_CHARS + 1)  # a server's higher limits pass


def test_greedy_generation_ends_at_the_step_a_stop_string_appears(decoder):
    model, tok = decoder
    prompt = tok.encode("the cat", add_special_tokens=False).ids
    ids, options = torch.tensor([prompt]), GenerationOptions(max_new_tokens=20)
    whole = lmforge.generate(model, ids, options=options)[0, len(prompt):].tolist()
    text = continuation(tok, prompt, whole)
    stop = text[8:11]
    shown, steps = [], []
    tail = TextTail(tok, (stop,), prompt)
    new = generate_until_stop(model, ids, tail, options=options,
                              show=lambda delta, token_ids: (shown.append(delta), steps.append(token_ids)))
    assert tail.stopped and tail.text == text[:text.index(stop)] == "".join(shown) != ""
    assert len(steps) == len(new) < len(whole) and new == whole[:len(new)]  # no step after the stop's
    assert stop in continuation(tok, prompt, new) and stop not in continuation(tok, prompt, new[:-1])


def test_beam_search_s_text_is_cut_after_as_greedy_s_is_as_it_grows(decoder):
    model, tok = decoder
    prompt = tok.encode("the cat", add_special_tokens=False).ids
    ids, options = torch.tensor([prompt]), GenerationOptions(max_new_tokens=12, num_beams=2)
    whole = continuation(tok, prompt, lmforge.generate(model, ids, options=options)[0, len(prompt):].tolist())
    stop = whole[8:11]
    tail = TextTail(tok, (stop,), prompt)
    new = generate_until_stop(model, ids, tail, options=options)
    assert tail.stopped and tail.text == whole[:whole.index(stop)] != ""
    assert stop in continuation(tok, prompt, new) and stop not in continuation(tok, prompt, new[:-1])


@pytest.mark.parametrize("family", ["bert", "gpt2"])
def test_a_long_text_stops_where_its_whole_decoding_first_holds_a_stop_string(family):
    """Each id's step decodes only the last ids and seeks stop strings in the text it may change: the text,
    the ids kept and the shown pieces are still those of the whole decoding, far past the settled text."""
    tok = tokenizer(family)
    prompt = tok.encode("the cat", add_special_tokens=False).ids
    ids = tok.encode("the film was long and the actors were good , " * 20 + "a plot twist at last",
                     add_special_tokens=False).ids
    whole = continuation(tok, prompt, ids)
    stop = whole[-12:-5]
    tail = TextTail(tok, (stop, "never there"), prompt)
    shown = []
    for token in ids:
        shown.append(tail.push(token))
        if tail.stopped:
            break
    assert tail.joined.base > 0 and tail.stopped and whole.index(stop) > len(tail.joined.settled)
    assert tail.text == whole[:whole.index(stop)] == "".join(shown)
    kept = tail.joined.ids
    assert kept == ids[:len(kept)] and stop in continuation(tok, prompt, kept)
    assert stop not in continuation(tok, prompt, kept[:-1])  # no step after the stop's


@pytest.mark.parametrize("prompts, each, field", [(2, 1, "input_ids"), (1, 2, "num_return_sequences")])
def test_generate_until_stop_refuses_more_than_one_text(decoder, prompts, each, field):
    """One prompt, one text: every path read row 0 alone, so a second prompt or sequence was dropped unsaid
    (the stop-free and beam paths too, where no StopRows counts the rows)."""
    model, tok = decoder
    ids = torch.tensor([tok.encode("the cat", add_special_tokens=False).ids] * prompts)
    for beams in (1, 2):
        options = GenerationOptions(max_new_tokens=2, num_beams=beams, num_return_sequences=each,
                                    do_sample=each > beams)
        with pytest.raises(OptionsError, match="one prompt into one text") as err:
            generate_until_stop(model, ids, TextTail(tok), options=options)
        assert err.value.field == field
