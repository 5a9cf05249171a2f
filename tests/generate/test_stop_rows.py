"""lmforge.generate(..., stop_strings=, tokenizer=) (generate/stop_rows.py): each row of a batch ends at the
step its new text holds a stop string, by the rule of `lmforge generate --stop` and the server's `stop`, so
its ids are those generate_until_stop gives its prompt alone; finished rows are padded after."""
from __future__ import annotations

import pytest
import torch

import lmforge
from lmforge.config.options import OptionsError
from lmforge.generate import stop_rule
from lmforge.generate.options import GenerationOptions
from lmforge.generate.stop_rows import StopRows
from lmforge.generate.stops import MAX_STOP, StopLimitError, TextTail, generate_until_stop
from lmforge.generate.text import continuation
from lmforge.heads import attach
from tests.tasks.core import tokenizer

PAD = 1  # not 0: beam search, as the reference, fills with -1 where the pad id is 0


def _prompt(tok, text: str) -> list:
    return tok.encode(text, add_special_tokens=False).ids


def _alone(model, tok, prompt: list, stops: tuple, **settings) -> list:
    """The new ids generate_until_stop gives `prompt` alone (the command line's and the server's way)."""
    tail = TextTail(tok, stops, prompt)
    call = {"seed": settings.pop("seed")} if "seed" in settings else {}
    return generate_until_stop(model, torch.tensor([prompt]), tail, options=GenerationOptions(**settings),
                               **call)


def _stop_in(model, tok, prompt: list, at: int, **settings) -> str:
    """Three characters of the text `prompt`'s free run makes, from character `at`."""
    free = lmforge.generate(model, torch.tensor([prompt]), **settings)[0, len(prompt):].tolist()
    text = continuation(tok, prompt, free)
    assert len(text) > at + 3, text
    return text[at:at + 3]


@pytest.mark.parametrize("settings", [{}, {"do_sample": True, "seed": 3}, {"num_beams": 2}],
                         ids=["greedy", "sampled", "beams"])
def test_one_prompt_s_ids_are_generate_until_stop_s(decoder, settings):
    model, tok = decoder
    prompt, settings = _prompt(tok, "the cat"), {"max_new_tokens": 16, **settings}
    stop = _stop_in(model, tok, prompt, 6, **settings)
    out = lmforge.generate(model, torch.tensor([prompt]), stop_strings=[stop], tokenizer=tok, **settings)
    new = out[0, len(prompt):].tolist()
    assert new == _alone(model, tok, prompt, (stop,), **settings)
    assert stop in continuation(tok, prompt, new) and stop not in continuation(tok, prompt, new[:-1])
    assert out.shape[1] == len(prompt) + len(new) < len(prompt) + 16  # ended there, nothing after


@pytest.mark.parametrize("beams", [1, 2])
def test_each_row_of_a_batch_stops_on_its_own_as_it_does_alone(decoder, beams):
    model, tok = decoder
    prompts = [[5, 6, 7, 8, 9], [100, 7, 50, 3, 80]]  # unpadded: each row's numbers are those of its own run
    settings = {"max_new_tokens": 16, "pad_token_id": PAD, "num_beams": beams}
    stops = (_stop_in(model, tok, prompts[0], 2, **settings), _stop_in(model, tok, prompts[1], 9, **settings))
    out = lmforge.generate(model, torch.tensor(prompts), stop_strings=list(stops), tokenizer=tok, **settings)
    alone = [_alone(model, tok, prompt, stops, **settings) for prompt in prompts]
    assert len(alone[0]) != len(alone[1])  # they stop at different steps
    T = len(prompts[0])
    for row, ids in enumerate(alone):
        assert out[row, T:T + len(ids)].tolist() == ids
        assert (out[row, T + len(ids):] == PAD).all()  # a finished row is padded, as after a stop token
    assert out.shape[1] == T + max(map(len, alone))


def test_a_stop_string_never_met_changes_nothing(decoder):
    model, tok = decoder
    ids = torch.tensor([_prompt(tok, "the cat")])
    free = lmforge.generate(model, ids, max_new_tokens=8)
    never = lmforge.generate(model, ids, max_new_tokens=8, stop_strings="\u2603", tokenizer=tok)
    assert torch.equal(never, free)


@pytest.mark.parametrize("beams", [1, 2])
def test_a_batch_s_rows_only_seek_nothing_is_held_back_for_a_stream(decoder, monkeypatch, beams):
    model, tok = decoder
    held = []  # stop_rule.held: what a stream holds back, each step, sought in every stop string's prefixes
    monkeypatch.setattr(stop_rule, "held", lambda text, stops: held.append(text) or 0)
    out = lmforge.generate(model, torch.tensor([[5, 6, 7], [8, 9, 10]]), max_new_tokens=8, pad_token_id=PAD,
                           num_beams=beams, stop_strings=["\u2603" * 200], tokenizer=tok)
    assert held == [] and out.shape == (2, 11)  # nothing is shown: a row's text is only sought


def test_an_encoder_decoder_s_answer_is_its_own_text():
    tok = tokenizer("gpt2")
    torch.manual_seed(0)
    model = lmforge.build(lmforge.tiny("t5-small", vocab_size=tok.vocab_size))
    attach(model, "lm")
    ids = torch.tensor([_prompt(tok, "the cat")])
    settings = {"max_new_tokens": 16, "decoder_start_token_id": 50, "suppress_tokens": [0]}  # 0: no text
    free = lmforge.generate(model, ids, **settings)[0, 1:].tolist()
    stop = continuation(tok, [], free)[5:8]
    new = lmforge.generate(model, ids, stop_strings=stop, tokenizer=tok, **settings)[0, 1:].tolist()
    assert new == free[:len(new)] and stop in continuation(tok, [], new)
    assert stop not in continuation(tok, [], new[:-1])


@pytest.mark.parametrize("call, field", [
    ({"stop_strings": ["a"], "tokenizer": None}, "tokenizer"),
    ({"stop_strings": ["a"], "tokenizer": "gpt2"}, "tokenizer"),
    ({"stop_strings": ""}, "stop_strings"),
    ({"stop_strings": ["a", ""]}, "stop_strings.1"),
    ({"stop_strings": ["a", 3]}, "stop_strings.1"),
    ({"stop_strings": ["a"] * (MAX_STOP + 1)}, "stop_strings"),
    ({"stop_strings": ["a"], "num_return_sequences": 2, "do_sample": True}, "pad_token_id"),
])
def test_bad_stop_strings_are_refused_naming_the_argument(decoder, call, field):
    model, tok = decoder
    call = {"tokenizer": tok, **call}
    with pytest.raises(OptionsError) as err:
        lmforge.generate(model, torch.tensor([[5, 6]]), max_new_tokens=2, **call)
    assert err.value.field == field and "\n" not in str(err.value)
    assert field in str(err.value)  # the message names it too: "a stop string is empty" said not which
    assert isinstance(err.value, StopLimitError) == (len(call["stop_strings"]) > MAX_STOP)


@pytest.mark.parametrize("stopped", [True, False], ids=["stop", "no-stop"])
def test_a_streamed_prompt_ends_and_is_shown_by_generate_s_own_stop_rows(decoder, monkeypatch, stopped):
    """generate_until_stop's streamed steps are lmforge.generate(stop_strings=)'s: its TextTail is the one
    row StopRows seeks and shows (it raised StopText from a streamer of its own, a second way to end)."""
    model, tok = decoder
    prompt, settings = _prompt(tok, "the cat"), {"max_new_tokens": 16}
    stops = (_stop_in(model, tok, prompt, 6, **settings),) if stopped else ()
    rows, ended = [], StopRows.ended
    monkeypatch.setattr(StopRows, "ended", lambda self, *a: rows.append(len(self.tails)) or ended(self, *a))
    tail, shown = TextTail(tok, stops, prompt), []
    new = generate_until_stop(model, torch.tensor([prompt]), tail, options=GenerationOptions(**settings),
                              show=lambda text, token_ids: shown.append(text))
    assert rows == [1] * len(new) and tail.stopped == stopped and "".join(shown) == tail.text != ""
    assert new == _alone(model, tok, prompt, stops, **settings)


def test_a_stop_rows_is_no_public_stop_strings(decoder):
    """stop_strings is a str or a list: a StopRows (generate_until_stop's tail) has a private route now, so
    the public argument refuses it naming stop_strings, as it refuses any other kind."""
    model, tok = decoder
    rows = StopRows([TextTail(tok, ("x",), [])])
    with pytest.raises(OptionsError, match="a str or a list of str, got StopRows") as err:
        lmforge.generate(model, torch.tensor([[5, 6]]), stop_strings=rows, tokenizer=tok, max_new_tokens=2)
    assert err.value.field == "stop_strings"


def test_stop_rows_for_call_of_one_tail_for_more_returned_rows_is_refused(decoder):
    """zip paired the first tails only and the (1,) result broadcast: every row ended with the first. A
    StopRows seeks one row a tail, so a call returning more rows is refused naming what makes them."""
    tok = decoder[1]
    rows = StopRows([TextTail(tok, ("x",), _prompt(tok, "the cat"))])
    ids = torch.tensor([_prompt(tok, "the cat")])
    options = GenerationOptions(max_new_tokens=2, do_sample=True, num_return_sequences=2, pad_token_id=PAD)
    for prompts, each, field in ((ids, options, "num_return_sequences"),
                                 (ids.repeat(2, 1), GenerationOptions(pad_token_id=PAD), "input_ids")):
        with pytest.raises(OptionsError, match="rows for a StopRows of 1") as refused:
            rows.for_call(prompts, torch.ones_like(prompts), each, PAD, False)
        assert refused.value.field == field


def test_stop_rows_for_call_of_more_rows_without_a_pad_token_is_refused(decoder):
    """StopRows.for_call (a public method) skipped stop_rows' pad rule: two rows and no pad id went on, a
    row that ended first unpadded (_Finished pads none), unsaid. Refused as stop_rows refuses it; one row is
    not."""
    tok = decoder[1]
    rows = StopRows([TextTail(tok, ("x",), []), TextTail(tok, ("x",), [])])
    ids, greedy = torch.tensor([[5, 6], [7, 8]]), GenerationOptions(max_new_tokens=2)
    with pytest.raises(OptionsError, match="stop_strings with 2 rows need a pad token") as err:
        rows.for_call(ids, torch.ones_like(ids), greedy, None, False)
    assert err.value.field == "pad_token_id"
    assert rows.for_call(ids, torch.ones_like(ids), greedy, PAD, False) is rows
    one = StopRows([TextTail(tok, ("x",), [])])
    assert one.for_call(ids[:1], torch.ones_like(ids[:1]), greedy, None, False) is one
