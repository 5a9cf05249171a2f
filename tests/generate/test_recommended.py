"""A checkpoint's generation_config.json is read once with the model and is where every face starts: Python's
lmforge.generate, `lmforge generate` and the server's /generate give the same tokens as each other and as
the reference's model.generate on the same directory, and an explicit value overrides it alike."""
import json
import warnings

import pytest
import torch

import lmforge
from lmforge.cli import main
from lmforge.config.options import OptionsError
from lmforge.generate.options import GenerationWarning
from lmforge.generate.recommended import Recommendation, recommendation
from lmforge.generate.text import continuation
from tests.parity.helpers import confident_gpt2, transformers
from tests.tasks.core import tokenizer

SETTINGS = dict(num_beams=2, no_repeat_ngram_size=2, min_new_tokens=3, max_new_tokens=8, do_sample=False)
OVERRIDE = dict(num_beams=1, no_repeat_ngram_size=0, min_new_tokens=0)  # each one of the checkpoint's, off


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """(directory, the reference read from it, a two-token prompt): a tiny gpt2 whose generation_config.json
    recommends beams, n-gram blocking and a minimum, and whose stop token is the plain greedy text's first."""
    path, tok = tmp_path_factory.mktemp("recommended") / "gpt2", tokenizer("gpt2")
    reference = confident_gpt2(tok.vocab_size, seed=3)
    ids = torch.tensor([tok.encode("the cat", add_special_tokens=False).ids])
    plain = reference.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=2, do_sample=False,
                               pad_token_id=0)[0, ids.shape[1]:].tolist()
    reference.config.eos_token_id = plain[1]  # the plain text stops at once; the minimum holds it off
    reference.save_pretrained(path)
    (path / "generation_config.json").write_text(json.dumps({**SETTINGS, "eos_token_id": plain[1],
                                                             "pad_token_id": 0}))
    tok.save(path)
    return path, transformers.GPT2LMHeadModel.from_pretrained(path).eval(), ids


def _theirs(checkpoint, **overrides) -> list:
    _, reference, ids = checkpoint
    out = reference.generate(ids, attention_mask=torch.ones_like(ids), **overrides)
    return out[0, ids.shape[1]:].tolist()


def _served(checkpoint, body: dict) -> list:
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from lmforge.serve.app import create_app
    from lmforge.serve.models import load_served

    with TestClient(create_app({"gen": load_served("gen", checkpoint[0])}, threads=1)) as client:
        answer = client.post("/generate", json={"model": "gen", "prompt": "the cat", **body}).json()
    assert "token_ids" in answer, answer
    return answer["token_ids"]


def _command_line(checkpoint, capsys, *flags) -> str:
    capsys.readouterr()
    assert main(["generate", "--model", str(checkpoint[0]), "the cat", *flags]) == 0
    return capsys.readouterr().out


def _copy(checkpoint, folder):
    folder.mkdir()
    for file in checkpoint[0].iterdir():
        (folder / file.name).write_bytes(file.read_bytes())
    return folder


def test_load_keeps_the_checkpoint_s_settings_on_the_model(checkpoint):
    found = recommendation(lmforge.load(checkpoint[0]))
    assert isinstance(found, Recommendation) and found.fields["num_beams"] == 2
    assert recommendation(lmforge.build("gpt2", n_layers=1, d_model=32, n_heads=4, d_ff=64)) is None


def test_every_face_starts_from_the_checkpoint_as_the_reference_does(checkpoint, capsys):
    path, _, ids = checkpoint
    theirs = _theirs(checkpoint)
    assert len(theirs) >= SETTINGS["min_new_tokens"]  # the checkpoint's minimum held the stop off
    assert lmforge.generate(lmforge.load(path), ids)[0, ids.shape[1]:].tolist() == theirs
    assert _served(checkpoint, {}) == theirs
    tok = lmforge.load_tokenizer(path)
    assert _command_line(checkpoint, capsys) == "the cat" + continuation(tok, ids[0].tolist(), theirs) + "\n"


def test_an_explicit_value_overrides_the_checkpoint_alike_in_every_face(checkpoint, capsys):
    path, _, ids = checkpoint
    theirs = _theirs(checkpoint, **OVERRIDE)
    assert theirs != _theirs(checkpoint)
    assert lmforge.generate(lmforge.load(path), ids, **OVERRIDE)[0, ids.shape[1]:].tolist() == theirs
    assert _served(checkpoint, OVERRIDE) == theirs
    tok = lmforge.load_tokenizer(path)
    flags = ("--num-beams", "1", "--no-repeat-ngram-size", "0", "--min-new-tokens", "0")
    assert _command_line(checkpoint, capsys, *flags) == \
        "the cat" + continuation(tok, ids[0].tolist(), theirs) + "\n"


def test_a_recommended_max_length_counts_the_prompt_in_python_too(checkpoint, tmp_path):
    path, _, ids = checkpoint
    copy = _copy(checkpoint, tmp_path / "max-length")
    settings = {k: v for k, v in SETTINGS.items() if k != "max_new_tokens"}
    (copy / "generation_config.json").write_text(json.dumps({**settings, "max_length": ids.shape[1] + 5}))
    with warnings.catch_warnings():
        warnings.simplefilter("error", GenerationWarning)  # applied, so nothing said
        out = lmforge.generate(lmforge.load(copy), ids, min_new_tokens=5)
    assert out.shape[1] == ids.shape[1] + 5


def test_a_recommended_max_length_the_prompt_already_reaches_is_refused_naming_max_new_tokens(
        checkpoint, tmp_path, capsys):
    """One new token was generated unsaid where the prompt reached the checkpoint's max_length (the reference
    refuses it); a max_new_tokens given is served, in Python and on the command line alike."""
    _, reference, ids = checkpoint
    copy = _copy(checkpoint, tmp_path / "reached")
    (copy / "generation_config.json").write_text(json.dumps({"max_length": ids.shape[1], "pad_token_id": 0}))
    model = lmforge.load(copy)
    reached = rf"max_length={ids.shape[1]}, which the {ids.shape[1]} tokens .* already reach"
    with pytest.raises(OptionsError, match=reached) as err:
        lmforge.generate(model, ids)
    assert err.value.field == "max_new_tokens"
    with pytest.raises(ValueError, match="max_length"):
        reference.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=None,
                           max_length=ids.shape[1])
    served = lmforge.generate(model, ids, max_new_tokens=3)[0, ids.shape[1]:].tolist()
    assert served == _theirs(checkpoint, max_new_tokens=3, **OVERRIDE)
    capsys.readouterr()
    assert main(["generate", "--model", str(copy), "the cat"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "--max-new-tokens" in err and "Traceback" not in err
    assert main(["generate", "--model", str(copy), "the cat", "--max-new-tokens", "2"]) == 0


def test_a_bad_recommendation_is_refused_when_generating_naming_the_file(checkpoint, tmp_path):
    """Loaded to embed or fine-tune, the model is not refused for settings it never uses."""
    copy = _copy(checkpoint, tmp_path / "bad")
    (copy / "generation_config.json").write_text(json.dumps({"num_beams": 0}))
    model = lmforge.load(copy)
    assert model(checkpoint[2]).last_hidden_state.shape[1] == checkpoint[2].shape[1]
    with pytest.raises(OptionsError, match="generation_config.json.*num_beams"):
        lmforge.generate(model, checkpoint[2])


@pytest.mark.parametrize("format", ["lmforge", "hf"])
def test_a_saved_model_recommends_what_it_was_loaded_with(checkpoint, tmp_path, format):
    """A load and a save (lmforge convert, a fine-tuned copy) kept the weights and lost the settings."""
    model = lmforge.load(checkpoint[0])
    model.save(tmp_path / "out", format=format)
    again = recommendation(lmforge.load(tmp_path / "out"))
    assert again.fields == recommendation(model).fields
    _, _, ids = checkpoint
    out = lmforge.generate(lmforge.load(tmp_path / "out"), ids)
    assert out[0, ids.shape[1]:].tolist() == _theirs(checkpoint)


@pytest.mark.parametrize("format", ["lmforge", "hf"])
def test_an_encoder_recommends_nothing_and_its_export_gets_no_generation_config(tmp_path, format):
    """A BERT read from a Hugging Face folder was given the reference's default top_k, and every save of it
    wrote a generation_config.json that no encoder has (docs/convert.md: "an encoder gets none")."""
    reference = transformers.BertModel(transformers.BertConfig(
        vocab_size=40, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32))
    reference.save_pretrained(tmp_path / "bert")
    model = lmforge.load(tmp_path / "bert")
    assert recommendation(model) is None
    model.save(tmp_path / "out", format=format)
    assert not (tmp_path / "out" / "generation_config.json").exists()


def test_a_forced_id_switched_off_stays_off_through_a_save_and_a_load(tmp_path):
    """OFF (-1) is written as the reference's null, and a null forced id is read back as none over the
    model config's: it was read as no setting, so the config's forced token came back."""
    from lmforge.generate.options import GenerationOptions
    from lmforge.generate.recommended import resolve

    model = lmforge.build(lmforge.tiny("bart-base", forced_eos_token_id=2))
    model.save(tmp_path / "m")
    GenerationOptions(forced_eos_token_id=-1, suppress_tokens=[]).save(tmp_path / "m")
    written = json.loads((tmp_path / "m" / "generation_config.json").read_text())
    assert written["forced_eos_token_id"] is None and written["suppress_tokens"] == []
    loaded = lmforge.load(tmp_path / "m")
    assert resolve(loaded, 1).forced_eos_token_id == -1
    loaded.save(tmp_path / "again")  # and written back as it was read
    again = json.loads((tmp_path / "again" / "generation_config.json").read_text())
    assert again["forced_eos_token_id"] is None
