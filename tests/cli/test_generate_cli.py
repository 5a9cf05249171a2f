"""`lmforge generate` and `lmforge fill-mask` refuse bad input in one line naming the option, before
anything reaches standard output; a T5 without decoder_start_token_id starts from its pad token."""
import warnings

import pytest
import torch

import lmforge
from lmforge.cli import main
from lmforge.config.options import OptionsError
from lmforge.generate.checks import GenerationWarning
from lmforge.heads import attach
from tests.tasks.core import tokenizer


def _save(root, name, family, lm=True, **overrides):
    tok = tokenizer(family)
    torch.manual_seed(0)
    preset = {"gpt2": "gpt2", "t5": "t5-small", "bert": "bert-base"}[family]
    model = lmforge.build(lmforge.tiny(preset, vocab_size=len(tok), **overrides))
    if lm:
        attach(model, "lm")
    model.save(root / name)
    tok.save(root / name)
    return root / name


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("gencli")
    return {"gpt2": _save(root, "gpt2", "gpt2"), "gpt2-cls": _save(root, "gpt2-cls", "gpt2", lm=False),
            "bert-cls": _save(root, "bert-cls", "bert", lm=False),
            "t5": _save(root, "t5", "t5", pad_token_id=0, eos_token_id=1)}


def _refused(capsys, argv) -> str:
    """The one error line of a command refused with status 2 before it printed anything."""
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "", out  # nothing printed before the refusal: not even the prompt
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("flags, message", [
    (["--max-new-tokens", "0"],
     "--max-new-tokens 0: max_new_tokens must be an integer >= 1 and <= 4096, got 0"),
    (["--max-new-tokens", "5000"],
     "--max-new-tokens 5000: max_new_tokens must be an integer >= 1 and <= 4096"),
    (["--num-beams", "0"], "--num-beams 0: num_beams must be an integer >= 1 and <= 64"),
    (["--num-beams", "1000000"], "--num-beams 1000000: num_beams must be an integer >= 1 and <= 64"),
    (["--top-k", "-1"], "--top-k -1: top_k must be an integer >= 0"),
    (["--top-k", "many"], "--top-k many: top_k must be an integer, got 'many'"),
    (["--top-k", "2.5"], "--top-k 2.5: top_k must be a whole number"),
    (["--min-new-tokens", "-2"], "--min-new-tokens -2: min_new_tokens must be an integer >= 0"),
    (["--min-new-tokens", "50", "--max-new-tokens", "5"],
     "--min-new-tokens 50: min_new_tokens=50 is more than max_new_tokens=5"),
    (["--num-beams", "3", "--temperature", "0.7"], "--num-beams 3: num_beams=3 with sampling"),
    (["--max-new-tokens", "100"], "--max-new-tokens 100: 4 starting tokens plus max_new_tokens=100 exceed"),
    (["--top-k", "10000"], "--top-k 10000: top_k=10000 is more than the vocabulary"),
    (["--do-sample", "yes"], "--do-sample yes: do_sample must be true or false, got 'yes'"),
    (["--early-stopping", "sometimes"], "--early-stopping sometimes: early_stopping must be true, false or"),
    (["--top-k", "5"], "--top-k 5: top_k=5 is read only when sampling"),  # no --temperature: greedy
    (["--length-penalty", "2"], "--length-penalty 2: length_penalty=2.0 is read only by beam search"),
])
def test_generate_refuses_bad_counts_naming_the_flag(dirs, capsys, flags, message):
    assert message in _refused(capsys, ["generate", "--model", str(dirs["gpt2"]), "the cat", *flags])


@pytest.mark.parametrize("greedy", [[], ["--temperature", "0"], ["--num-beams", "2"]])
def test_a_seed_is_refused_where_nothing_is_sampled_as_top_k_is(dirs, capsys, greedy):
    """--seed, like --top-k, is read only when sampling: given to greedy or beam search it would change
    nothing, so it is refused in the same words; given with sampling, it is what decides the text."""
    argv = ["generate", "--model", str(dirs["gpt2"]), "the cat", "--max-new-tokens", "6"]
    for flag, field in (("--seed", "seed"), ("--top-k", "top_k")):
        err = _refused(capsys, [*argv, *greedy, flag, "3"])
        assert f"{flag} 3: {field}=3 is read only when sampling" in err and "leave it out for greedy" in err
    sampled = []
    for seed in ("3", "3", "4"):
        assert main([*argv, "--temperature", "5", "--seed", seed]) == 0  # a hot temperature: seeds differ
        sampled.append(capsys.readouterr().out)
    assert sampled[0] == sampled[1] != sampled[2]


def test_an_empty_prompt_is_refused(dirs, capsys):
    err = _refused(capsys, ["generate", "--model", str(dirs["gpt2"]), ""])
    assert "the prompt '' holds no tokens" in err


def test_a_prompt_longer_than_the_context_is_refused(dirs, capsys):
    long = "the cat " * 60
    err = _refused(capsys, ["generate", "--model", str(dirs["gpt2"]), long, "--max-new-tokens", "1"])
    assert "more than the model's context (max_seq_len=64)" in err


@pytest.mark.parametrize("command, name, message", [
    ("generate", "gpt2-cls", "no language-modelling head ('lm'): generate needs a model pretrained"),
    ("fill-mask", "bert-cls", "no masked-LM head ('lm'): fill-mask needs a model pretrained with MLM"),
    ("fill-mask", "gpt2", "is a decoder: fill-mask needs an encoder"),
])
def test_models_without_the_head_a_command_needs_are_refused_in_cli_terms(dirs, capsys, command, name,
                                                                          message):
    err = _refused(capsys, [command, "--model", str(dirs[name]), "a [MASK] b"])
    assert message in err and "attach(" not in err  # no Python advice in a command's message


@pytest.mark.parametrize("flags, message", [
    (["--top-k", "0"], "--top-k 0: top_k must be an integer >= 1"),
    (["--max-span", "0"], "--max-span 0: max_span must be an integer >= 1"),
    (["--top-k", "65"], "top_k=65: an encoder-decoder's fillings are beams")])
def test_fill_mask_refuses_bad_counts_naming_the_flag(dirs, capsys, flags, message):
    assert message in _refused(capsys, ["fill-mask", "--model", str(dirs["t5"]), "a [MASK] b", *flags])


def test_a_t5_without_decoder_start_starts_from_its_pad_token(dirs, capsys):
    path = dirs["t5"]
    assert lmforge.load(path).config.decoder_start_token_id is None
    said = r"starts from the pad token \(id 0\)"
    with warnings.catch_warnings(), pytest.warns(GenerationWarning, match=said):
        warnings.simplefilter("always")  # the command shows it as one line on stderr (cli/__init__.py)
        assert main(["generate", "--model", str(path), "the film", "--max-new-tokens", "3"]) == 0
    out = capsys.readouterr().out
    model, tok = lmforge.load(path), lmforge.load_tokenizer(path)
    ids = torch.tensor([tok.encode("the film").ids])
    expected = lmforge.generate(model, ids, max_new_tokens=3, decoder_start_token_id=0, eos_token_id=1)
    assert expected[0, 0] == 0 and out == tok.decode(expected[0, 1:].tolist()) + "\n"


def test_the_stream_prints_the_prompt_with_its_first_token(dirs, capsys):
    common = ["generate", "--model", str(dirs["gpt2"]), "the cat", "--max-new-tokens", "4"]
    assert main(common) == 0
    plain = capsys.readouterr().out
    assert main([*common, "--stream"]) == 0
    assert capsys.readouterr().out == plain and plain.startswith("the cat")


def test_a_checkpoint_setting_that_contradicts_a_flag_is_refused_in_one_line(dirs, capsys, tmp_path):
    import json
    import shutil

    path = tmp_path / "recommends"
    shutil.copytree(dirs["gpt2"], path)
    (path / "generation_config.json").write_text(json.dumps({"num_beams": 3, "min_length": 30}))
    err = _refused(capsys, ["generate", "--model", str(path), "the cat", "--temperature", "0.7"])
    assert "--num-beams (the checkpoint's or the default): num_beams=3 with sampling" in err
    err = _refused(capsys, ["generate", "--model", str(path), "the cat", "--max-new-tokens", "5"])
    assert "--min-new-tokens (the checkpoint's or the default): min_new_tokens=26 is more than " \
        "max_new_tokens=5" in err
    # a minimum typed replaces the checkpoint's other one (it had been refused as contradicting it)
    model, tok = lmforge.load(path), lmforge.load_tokenizer(path)
    ids = torch.tensor([tok.encode("the cat").ids])
    for flag, value in (("--min-new-tokens", 2), ("--min-length", ids.shape[1] + 3)):
        assert main(["generate", "--model", str(path), "the cat", "--max-new-tokens", "6", flag, str(value),
                     "--num-beams", "1"]) == 0
        field = flag[2:].replace("-", "_")
        # the same values over the checkpoint's, as the flags are: the same text
        want = lmforge.generate(model, ids, max_new_tokens=6, eos_token_id=tok.eos_id, num_beams=1,
                                **{field: value})
        assert capsys.readouterr().out == tok.decode(want[0].tolist()) + "\n"


def test_the_checkpoint_s_sampling_settings_are_said_only_where_they_are_read(dirs, capsys, tmp_path):
    import json
    import shutil

    path = tmp_path / "samples"
    shutil.copytree(dirs["gpt2"], path)
    (path / "generation_config.json").write_text(json.dumps({"do_sample": True, "top_k": 5, "top_p": 0.9,
                                                             "max_new_tokens": 3}))
    assert main(["generate", "--model", str(path), "the cat", "--seed", "1"]) == 0
    said = [line for line in capsys.readouterr().err.splitlines() if line.startswith("settings from")]
    assert said and "top_k=5" in said[0] and "top_p=0.9" in said[0]
    assert main(["generate", "--model", str(path), "the cat", "--temperature", "0"]) == 0  # greedy
    said = [line for line in capsys.readouterr().err.splitlines() if line.startswith("settings from")]
    assert said and "top_k" not in said[0] and "top_p" not in said[0] and "max_new_tokens=3" in said[0]


@pytest.mark.parametrize("text", ['{"max_new_tokens": 5, "num_be', "[5]", b"\xff{}"])
def test_a_damaged_generation_config_json_is_refused_naming_it_not_read_as_none(dirs, capsys, tmp_path, text):
    """A cut file was read as no file: the default settings (or config.json's), unsaid (helper's probe)."""
    import shutil

    from lmforge.generate.options import GenerationOptions
    from lmforge.io import CheckpointError

    path = tmp_path / "damaged"
    shutil.copytree(dirs["gpt2"], path)
    file = path / "generation_config.json"
    file.write_bytes(text) if isinstance(text, bytes) else file.write_text(text)
    with pytest.raises(CheckpointError, match=f"^{file}: not"):
        GenerationOptions.load(path)
    err = _refused(capsys, ["generate", "--model", str(path), "the cat"])
    assert f"{file}: not" in err


def test_new_wordpiece_text_joins_the_prompt_as_the_tokenizer_joins_it(tmp_path, capsys):
    from lmforge.cli.generate import TextStream
    from lmforge.generate.text import continuation

    tok = tokenizer("bert")
    piece = next(t for t in map(tok.id_to_token, range(tok.vocab_size)) if t.startswith("##") and len(t) > 2)
    context = tok.encode("the film", add_special_tokens=False).ids
    word = tok.encode("the", add_special_tokens=False).ids
    assert continuation(tok, context, word) == " the"  # decoded alone, the new word lost its space
    assert continuation(tok, context, [tok.token_to_id(piece)]) == piece[2:]  # and a "##" piece its join
    path = _save(tmp_path, "wordpiece-gpt", "bert")  # then a decoder in its place: gpt2, bert's vocabulary
    model = lmforge.build(lmforge.tiny("gpt2", vocab_size=len(tok)))
    attach(model, "lm")
    model.save(path)
    argv = ["generate", "--model", str(path), "the film", "--max-new-tokens", "4"]
    assert main(argv) == 0
    plain = capsys.readouterr().out
    prompt = context  # a decoder continues the bare text
    new = lmforge.generate(lmforge.load(path), torch.tensor([prompt]), max_new_tokens=4)
    assert plain == "the film" + continuation(tok, prompt, new[0, len(prompt):].tolist()) + "\n"
    assert main([*argv, "--stream"]) == 0 and capsys.readouterr().out == plain
    stream = TextStream(tok, "the film", prompt)
    stream.show(stream.tail.push(word[0]))  # the first new token is printed after the prompt with its join
    assert capsys.readouterr().out == "the film" + continuation(tok, prompt, word[:1])


def _new_text(capsys, argv) -> str:
    """The text a successful `lmforge generate` printed after its prompt "the cat"."""
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.startswith("the cat") and out.endswith("\n")
    return out[len("the cat"):-1]


@pytest.mark.parametrize("decoding", [[], ["--num-beams", "2"], ["--temperature", "1.5", "--seed", "3"]])
def test_stop_ends_the_text_before_the_stop_string_streamed_or_not(dirs, capsys, decoding):
    argv = ["generate", "--model", str(dirs["gpt2"]), "the cat", "--max-new-tokens", "16", *decoding]
    whole = _new_text(capsys, argv)
    stop = whole[8:11]
    cut = _new_text(capsys, [*argv, "--stop", stop, "--stop", "never in it \u2603"])
    assert stop and cut and cut == whole[:whole.index(stop)]
    if "--num-beams" not in decoding:  # beam search cannot stream
        assert _new_text(capsys, [*argv, "--stop", stop, "--stream"]) == cut


@pytest.mark.parametrize("stops, message", [
    ([""], "--stop '': a stop string is empty (the text would end before it began): leave it out"),
    (["a", "b c", ""], "--stop '': a stop string is empty"),
    (["a"] * 9, "--stop: 9 stop strings, more than the 8 allowed"),
    (["x" * 257], "--stop: a stop string of 257 characters, more than the 256 allowed"),
])
def test_a_bad_stop_is_refused_in_one_line_naming_the_flag(dirs, capsys, stops, message):
    """A bound is said as a number: the server's settings (max_stop, max_stop_chars) are no flags here."""
    argv = ["generate", "--model", str(dirs["gpt2"]), "the cat"]
    said = _refused(capsys, [*argv, *(f"--stop={stop}" for stop in stops)])
    assert message in said and "max_stop" not in said


def test_python_s_seed_samples_as_the_command_line_s_seed(dirs, capsys):
    """lmforge.generate(seed=s) draws as `lmforge generate --seed s` does (and the server's seed): the same
    tokens each time, those of a generator seeded by hand and the command line's text; a seed out of
    --seed's bounds, or with a generator too, is refused naming seed."""
    model, tok = lmforge.load(dirs["gpt2"]), lmforge.load_tokenizer(dirs["gpt2"])
    ids = torch.tensor([tok.encode("the cat", add_special_tokens=False).ids])
    sampled = {"do_sample": True, "temperature": 1.5, "max_new_tokens": 6}
    first, again = (lmforge.generate(model, ids, seed=7, **sampled) for _ in range(2))
    assert torch.equal(first, again)
    by_hand = lmforge.generate(model, ids, generator=torch.Generator().manual_seed(7), **sampled)
    assert torch.equal(first, by_hand)
    assert not torch.equal(first, lmforge.generate(model, ids, seed=8, **sampled))  # the seed is read
    argv = ["generate", "--model", str(dirs["gpt2"]), "the cat", "--temperature", "1.5", "--seed", "7",
            "--max-new-tokens", "6"]
    assert main(argv) == 0
    assert capsys.readouterr().out.strip() == tok.decode(first[0].tolist())
    for bad in ({"seed": -1}, {"seed": 2**63}, {"seed": 7, "generator": torch.Generator()}):
        with pytest.raises(OptionsError) as err:
            lmforge.generate(model, ids, **sampled, **bad)
        assert err.value.field == "seed" and "\n" not in str(err.value)


def test_a_sampling_flag_beside_do_sample_false_is_refused_as_a_contradiction(dirs, capsys):
    """--do-sample false --temperature 0.7: the two flags contradict, and the one line says so, naming
    temperature and what to give; not that temperature is read only when sampling, as if left to it."""
    argv = ["generate", "--model", str(dirs["gpt2"]), "the cat", "--do-sample", "false"]
    err = _refused(capsys, [*argv, "--temperature", "0.7"])
    assert "--temperature 0.7: temperature=0.7 contradicts do_sample=false" in err
    assert "give do_sample=true to sample, or leave temperature out" in err
    with pytest.raises(OptionsError, match="seed=3 contradicts do_sample=false") as python:  # Python's too
        lmforge.generate(lmforge.load(dirs["gpt2"]), torch.tensor([[5, 6]]), do_sample=False, seed=3)
    assert python.value.field == "seed"
