"""A checkpoint's generation settings switched off by explicit values (forced ids -1, suppress_tokens [],
min_new_tokens 0), alike in the three faces, give the reference's tokens with the same overrides."""
import json

import pytest
import torch

import lmforge
from lmforge.cli import main
from lmforge.generate import generate
from lmforge.generate.options import GenerationOptions
from lmforge.generate.text import continuation
from tests.parity.helpers import confident_gpt2, transformers
from tests.tasks.core import tokenizer

MIN_LENGTH = 6
OFF = dict(forced_bos_token_id=-1, suppress_tokens=[], min_new_tokens=0)  # lmforge's explicit "none"
HF_OFF = dict(forced_bos_token_id=None, suppress_tokens=[], min_new_tokens=0)  # the reference's


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """(directory, the reference read from it, the one-token prompt, its settings): a gpt2 whose
    generation_config.json forces a first token, suppresses the plain greedy text's first token and has
    a min_length past the plain text's stop, the second token it would produce."""
    path, tok = tmp_path_factory.mktemp("overrides") / "gpt2", tokenizer("gpt2")
    reference = confident_gpt2(tok.vocab_size, seed=6)  # its plain text's first two new tokens differ
    ids = torch.tensor([tok.encode("the", add_special_tokens=False).ids])
    assert ids.shape == (1, 1)
    plain = reference.generate(ids, generation_config=transformers.GenerationConfig(
        max_new_tokens=3, do_sample=False, pad_token_id=0))[0, 1:].tolist()
    first, stop = plain[0], plain[1]
    assert stop != first
    forced = next(t for t in range(3, tok.vocab_size) if t not in (first, stop))
    reference.config.eos_token_id = stop
    reference.save_pretrained(path)
    settings = dict(forced_bos_token_id=forced, suppress_tokens=[first], min_length=MIN_LENGTH,
                    eos_token_id=stop, pad_token_id=0, max_new_tokens=10, do_sample=False)
    (path / "generation_config.json").write_text(json.dumps(settings))
    tok.save(path)
    return path, transformers.GPT2LMHeadModel.from_pretrained(path).eval(), ids, settings


def _theirs(checkpoint, **overrides) -> list:
    path, reference, ids, _ = checkpoint
    return reference.generate(ids, attention_mask=torch.ones_like(ids), **overrides)[0].tolist()


def test_by_default_the_checkpoint_s_settings_apply_as_the_reference_applies_them(checkpoint):
    path, _, ids, settings = checkpoint
    ours = generate(lmforge.load(path), ids, options=GenerationOptions.load(path, start=1))[0].tolist()
    assert ours == _theirs(checkpoint)
    new = ours[1:]
    assert new[0] == settings["forced_bos_token_id"] and settings["suppress_tokens"][0] not in new
    assert settings["eos_token_id"] not in ours[:MIN_LENGTH]


def test_python_switches_them_off_as_the_reference_does(checkpoint):
    path, _, ids, settings = checkpoint
    theirs = _theirs(checkpoint, **HF_OFF)
    assert len(theirs) == 3 and theirs[-1] == settings["eos_token_id"]  # the plain text: stopped early
    assert theirs[1] == settings["suppress_tokens"][0]
    model, recommended = lmforge.load(path), GenerationOptions.load(path, start=1)
    assert generate(model, ids, options=recommended, **OFF)[0].tolist() == theirs
    # the checkpoint read without start (min_length stays whole): min_new_tokens=0 overrides it too
    assert generate(model, ids, options=GenerationOptions.load(path), **OFF)[0].tolist() == theirs


def test_the_command_line_switches_them_off(checkpoint, capsys):
    path, _, _, _ = checkpoint
    tok = lmforge.load_tokenizer(path)
    theirs = _theirs(checkpoint, **HF_OFF)
    assert main(["generate", "--model", str(path), "the", "--forced-bos-token-id", "-1",
                 "--suppress-tokens", "[]", "--min-new-tokens", "0"]) == 0
    out = capsys.readouterr().out
    assert out == "the" + continuation(tok, theirs[:1], theirs[1:]) + "\n"


def test_the_server_switches_them_off(checkpoint):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from lmforge.serve.app import create_app
    from lmforge.serve.models import load_served

    path = checkpoint[0]
    theirs = _theirs(checkpoint, **HF_OFF)
    body = {"model": "gen", "prompt": "the", "max_new_tokens": 10, **OFF}
    with TestClient(create_app({"gen": load_served("gen", path)}, threads=1)) as client:
        forced = client.post("/generate", json={**body, "forced_bos_token_id": None}).json()
        answer = client.post("/generate", json=body).json()
    assert answer["token_ids"] == theirs[1:], answer
    assert "forced_bos_token_id" in forced["error"]["message"]  # null is refused, as elsewhere


def test_save_writes_the_reference_s_none_not_the_sentinel(checkpoint, tmp_path):
    options = GenerationOptions(forced_bos_token_id=-1, forced_eos_token_id=-1, suppress_tokens=[])
    written = json.loads(options.save(tmp_path).read_text())
    assert written["forced_bos_token_id"] is None and written["forced_eos_token_id"] is None
    assert written["suppress_tokens"] == []
    assert transformers.GenerationConfig.from_pretrained(tmp_path).forced_bos_token_id is None
