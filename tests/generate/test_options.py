"""GenerationOptions (generate/options.py) through generate and the command line: bad, non-finite or unread
settings refused in one line naming the field before any model call, defaults and settings the decoding reads
taken, an options object equal to keywords, and the round trip through generation_config.json."""
import pytest
import torch

import lmforge
from lmforge.config.options import OptionsError
from lmforge.generate import GenerationOptions, generate
from lmforge.generate.options import GenerationWarning
from lmforge.heads import attach


def _gpt2():
    """A tiny GPT-2 with its (tied) LM head."""
    torch.manual_seed(0)
    model = lmforge.build(lmforge.tiny("gpt2", decoder_start_token_id=0)).eval()
    attach(model, "lm")
    return model


GPT2 = _gpt2()


@pytest.mark.parametrize("options, match", [
    (dict(temperature=float("nan")), "temperature must be a finite number"),  # greedy too: NaN is a mistake
    (dict(temperature=float("inf")), "temperature must be a finite number"),
    (dict(temperature=-1.0), "temperature must be a finite number >= 0.0"),  # greedy too: never ignored
    (dict(do_sample=True, temperature=float("nan")), "temperature must be a finite number"),
    (dict(do_sample=True, temperature=float("inf")), "temperature must be a finite number"),
    (dict(do_sample=True, temperature=-0.5), "temperature must be a finite number >= 0.0"),
    (dict(do_sample=True, temperature=0.0), "temperature must be > 0 when sampling"),
    (dict(do_sample=True, top_p=float("nan")), "top_p must be a finite number > 0.0 and <= 1.0"),
    (dict(top_p=float("nan")), "top_p must be a finite number > 0.0"),
    (dict(min_new_tokens=9, max_new_tokens=4), "min_new_tokens=9 is more than max_new_tokens=4"),
    (dict(num_beams=10**6), "num_beams must be an integer >= 1 and <= 64"),
    (dict(length_penalty=float("-inf")), "length_penalty must be a finite number"),
    (dict(do_sample="false"), "do_sample must be true or false"),
    (dict(top_k=True), "top_k must be an integer"),
    (dict(beams=2), "unknown generation option"),
])
def test_non_finite_sampling_settings_are_refused(options, match):
    with pytest.raises(OptionsError, match=match) as err:
        GenerationOptions(**options) if "beams" not in options else GenerationOptions.build(None, options)
    named = "beams" if match.startswith("unknown") else match.split()[0].split("=")[0]
    assert err.value.field == named  # the field to change, for the CLI's flag and the server's param


def test_generate_refuses_a_bad_option_before_any_model_call():
    model = GPT2
    calls = []
    hook = model.register_forward_pre_hook(lambda *a: calls.append(1))
    try:
        for options in (dict(temperature=-1), dict(min_new_tokens=5, max_new_tokens=3), dict(num_beams=10**6),
                        dict(top_k=500), dict(top_k="3")):
            with pytest.raises(OptionsError) as err:
                generate(model, torch.zeros(1, 3, dtype=torch.long), **options)
            assert err.value.field in options and "\n" not in str(err.value)
    finally:
        hook.remove()
    assert not calls


@pytest.mark.parametrize("given, named", [
    (dict(temperature=100.0), "temperature"), (dict(top_k=5), "top_k"), (dict(top_p=0.5), "top_p"),
    (dict(num_beams=2, temperature=0.5), "temperature"), (dict(length_penalty=2.0), "length_penalty"),
    (dict(early_stopping=True), "early_stopping"),
    (dict(do_sample=True, early_stopping="never"), "early_stopping"),
])
def test_a_setting_the_decoding_would_not_read_is_refused_not_ignored(given, named):
    """temperature=100 without sampling was greedy, silently; the command line and the server sample there.
    A setting given that the chosen decoding would ignore is refused naming it."""
    said = rf"^{named}=.* is read only (when sampling|by beam search)"
    with pytest.raises(OptionsError, match=said) as err:
        generate(GPT2, torch.zeros(1, 3, dtype=torch.long), max_new_tokens=2, **given)
    assert err.value.field == named


def test_a_long_early_stopping_is_refused_in_one_short_line():
    """A 4,000-character early_stopping came back whole (a 1,036-character 422 from POST /generate)."""
    with pytest.raises(OptionsError, match="early_stopping") as refused:
        GenerationOptions(early_stopping="x" * 4000)
    said = str(refused.value)  # the value's head and tail (utils.errors.shown), the middle counted
    assert len(said) < 140 and "\n" not in said and said.endswith("xx'") and "characters left out" in said


def test_settings_at_their_defaults_or_read_by_the_decoding_are_taken():
    """A default changes nothing (OpenAI's clients send top_p=1 always), temperature 0 is the faces' greedy,
    and a checkpoint's options object may hold settings its decoding does not read."""
    model, ids = GPT2, torch.zeros(1, 3, dtype=torch.long)
    greedy = generate(model, ids, max_new_tokens=3)
    for same in (dict(top_p=1.0, top_k=0, temperature=1.0), dict(temperature=0.0), dict(length_penalty=1.0)):
        assert torch.equal(generate(model, ids, max_new_tokens=3, **same), greedy)
    recommended = GenerationOptions(max_new_tokens=3, temperature=0.6, top_p=0.9)  # do_sample false
    assert torch.equal(generate(model, ids, options=recommended), greedy)
    generate(model, ids, max_new_tokens=3, do_sample=True, temperature=0.5, top_k=5, top_p=0.9)
    generate(model, ids, max_new_tokens=3, num_beams=2, length_penalty=2.0, early_stopping=True)


def test_options_object_and_keywords_give_the_same_tokens(tmp_path):
    model = GPT2
    ids = torch.zeros(1, 3, dtype=torch.long)
    options = GenerationOptions(max_new_tokens=5, num_beams=2, no_repeat_ngram_size=2)
    assert torch.equal(generate(model, ids, options=options),
                       generate(model, ids, max_new_tokens=5, num_beams=2, no_repeat_ngram_size=2))
    # keywords change the object's fields, checked again
    assert generate(model, ids, options=options, max_new_tokens=2).shape == (1, 5)
    with pytest.raises(OptionsError, match="num_return_sequences=3"):
        generate(model, ids, options=options, num_return_sequences=3)


def test_options_round_trip_through_generation_config_json(tmp_path):
    import json

    (tmp_path / "generation_config.json").write_text(
        json.dumps({"transformers_version": "4.45", "bos_token_id": 0}))
    options = GenerationOptions(num_beams=3, num_return_sequences=2, eos_token_id=[0, 1],
                                early_stopping="never", length_penalty=0.5)
    options.save(tmp_path)
    assert GenerationOptions.load(tmp_path) == options
    written = json.loads((tmp_path / "generation_config.json").read_text())
    # the file's other keys kept
    assert written["transformers_version"] == "4.45" and written["num_beams"] == 3
    (tmp_path / "generation_config.json").write_text(json.dumps({"top_p": 2.0, "max_length": 30}))
    with pytest.raises(OptionsError, match="generation_config.json: top_p must be") as err, \
            pytest.warns(GenerationWarning, match="max_length=30"):  # not applied without start=
        GenerationOptions.load(tmp_path)
    assert err.value.field == "top_p"
    (tmp_path / "generation_config.json").write_text(json.dumps({"max_length": 30, "min_length": 10}))
    assert GenerationOptions.load(tmp_path, start=4).max_new_tokens == 26  # a total length, as new tokens


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory):
    from tests.tasks.core import saved_lm

    return saved_lm(tmp_path_factory.mktemp("gen"))


@pytest.mark.parametrize("flags, message", [
    (["--temperature", "nan"], "--temperature nan: temperature must be a finite number"),
    (["--temperature", "inf"], "--temperature inf: temperature must be a finite number"),
    (["--temperature", "-1"], "--temperature -1: temperature must be a finite number >= 0.0 and <= 100.0"),
    (["--top-p", "nan"], "--top-p nan: top_p must be a finite number"),
    (["--top-p", "0"], "--top-p 0: top_p must be a finite number > 0.0 and <= 1.0"),
    (["--length-penalty=-inf"], "--length-penalty -inf: length_penalty must be a finite number"),
])
def test_generate_refuses_bad_decoding_numbers_in_one_line(gpt2_dir, capsys, flags, message):
    from lmforge.cli import main

    assert main(["generate", "--model", str(gpt2_dir), "the cat", "--max-new-tokens", "2", *flags]) == 2
    out, err = capsys.readouterr()
    assert out == ""  # refused before the prompt is echoed or anything generated
    assert err.count("\n") == 1 and "Traceback" not in err and message in err




@pytest.mark.parametrize("damage", ["folder", "cut", "deep"])
def test_a_recommendation_file_that_cannot_be_read_is_refused_naming_it(tmp_path, damage):
    """Read as absent, other settings than the file's would decode unsaid."""
    from lmforge.generate.options import read_recommended
    from lmforge.io import CheckpointError

    file = tmp_path / "generation_config.json"
    if damage == "folder":
        file.mkdir()
    else:  # cut short, or nested past the parser's recursion limit (a RecursionError before)
        file.write_text('{"num_beams": 2, "top' if damage == "cut" else
                        '{"a": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(CheckpointError, match="generation_config.json: not readable as JSON"):
        read_recommended(tmp_path)


def test_a_command_line_list_nested_past_the_parser_is_refused_naming_the_field():
    """json.loads raised a RecursionError (a traceback) on "[[[[..." thousands deep."""
    from lmforge.generate.options import checked_type

    with pytest.raises(OptionsError, match="suppress_tokens must be a JSON list of token ids") as refused:
        checked_type("suppress_tokens", "[" * 100_000 + "]" * 100_000, from_text=True)
    assert refused.value.field == "suppress_tokens"
