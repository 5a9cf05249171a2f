"""A retriever folder (BiEncoder.save: retriever.json, and passage/ where passages have an encoder of
their own) is read whole or refused naming the file; a model folder without retriever.json (and no
passage/) is a plain encoder: shared, default options."""
from __future__ import annotations

import json
import shutil

import pytest
import torch

import lmforge
from lmforge.cli import main
from lmforge.retrieval.dpr import BiEncoder, EncoderOptions
from lmforge.tokenizer.train import train_tokenizer

TEXTS = ["Paris is a city in France.", "The river runs to the sea."]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """(a plain tiny BERT folder, a retriever folder of it with its own passage encoder, cls pooling)."""
    root = tmp_path_factory.mktemp("retriever-dir")
    tok = train_tokenizer(TEXTS * 20, "wordpiece", 120)
    torch.manual_seed(0)
    model = lmforge.build("bert-base", n_layers=1, d_model=32, n_heads=2, d_ff=64, vocab_size=tok.vocab_size,
                          max_seq_len=64)
    model.save(root / "plain")
    tok.save(root / "plain")
    encoder = BiEncoder(model, tok, EncoderOptions(pooling="cls", max_length=32)).separate()
    with torch.no_grad():  # E_P is its own, not a copy of E_Q
        for weight in encoder.passage_model.parameters():
            weight.add_(0.1 * torch.randn_like(weight))
    model.save(root / "retriever")
    encoder.save(root / "retriever")
    return root / "plain", root / "retriever"


@pytest.fixture
def retriever(saved, tmp_path):
    return shutil.copytree(saved[1], tmp_path / "retriever")


def test_a_retriever_folder_reloads_whole(saved):
    again = BiEncoder.from_dir(saved[1])
    assert again.options == EncoderOptions(pooling="cls", max_length=32) and again.passage_model is not None
    assert not torch.allclose(again.encode(TEXTS), again.encode(TEXTS, passage=True))
    assert json.loads((saved[1] / "retriever.json").read_text())["passage_encoder"] is True


def test_a_plain_model_folder_is_a_shared_encoder_with_default_options(saved):
    plain = BiEncoder.from_dir(saved[0], max_length=16)
    assert plain.passage_model is None and plain.options == EncoderOptions(max_length=16)


@pytest.mark.parametrize("text", ["", '{"pooling": "cls", "normal', "[1, 2]", "\x00\xff junk"])
def test_a_truncated_or_junk_retriever_json_is_refused_naming_it(retriever, text):
    (retriever / "retriever.json").write_text(text, encoding="latin-1")
    with pytest.raises(ValueError, match=r"retriever\.json"):
        BiEncoder.from_dir(retriever)


@pytest.mark.parametrize("fields, said", [({"pooling": "max"}, "pooling"), ({"colour": "red"}, "colour"),
                                          ({"passage_encoder": "yes"}, "passage_encoder")])
def test_a_retriever_json_with_a_bad_field_is_refused_naming_file_and_field(retriever, fields, said):
    saved = json.loads((retriever / "retriever.json").read_text())
    (retriever / "retriever.json").write_text(json.dumps({**saved, **fields}))
    with pytest.raises(ValueError, match=rf"retriever\.json: .*{said}"):
        BiEncoder.from_dir(retriever)


def test_a_retriever_missing_a_side_file_is_refused_naming_it(retriever, capsys, tmp_path):
    (retriever / "passage" / "config.json").unlink()
    with pytest.raises(ValueError, match=r"passage/config\.json: missing"):
        BiEncoder.from_dir(retriever)
    # the whole passage encoder gone: retriever.json still says it had one
    shutil.rmtree(retriever / "passage")
    with pytest.raises(ValueError, match=r"passage/config\.json: missing"):
        BiEncoder.from_dir(retriever)
    (retriever / "passage").mkdir()
    (retriever / "retriever.json").unlink()  # passage/ shows it was a retriever: not read as a plain model
    assert main(["index", "build", "--out", str(tmp_path / "ix"), "--passages", "builtin", "--model",
                 str(retriever), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "retriever.json: missing" in err and err.count("\n") == 1, err


def test_a_passage_folder_beside_a_shared_encoders_retriever_json_is_refused(retriever):
    saved = json.loads((retriever / "retriever.json").read_text())
    (retriever / "retriever.json").write_text(json.dumps({**saved, "passage_encoder": False}))
    with pytest.raises(ValueError, match=r"passage: a passage encoder, but .*retriever\.json says"):
        BiEncoder.from_dir(retriever)


def test_a_changed_value_of_retriever_json_that_is_still_json_is_refused_naming_it(retriever, capsys):
    """max_length 32 -> 33 (one flipped bit) read as the retriever's options, unsaid; a lost file read as a
    plain encoder's default options (pooling mean for cls), unsaid (helper's probe)."""
    from lmforge.cli import main
    from lmforge.io.files import CheckpointError

    text = (retriever / "retriever.json").read_text()
    assert '"max_length": 32' in text
    (retriever / "retriever.json").write_text(text.replace('"max_length": 32', '"max_length": 33'))
    with pytest.raises(CheckpointError, match=r"retriever\.json does not match its checksum in config\.json"):
        BiEncoder.from_dir(retriever)
    out = retriever.parent / "ix"
    assert main(["index", "build", "--model", str(retriever), "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "retriever.json does not match its checksum" in err, err
    assert not out.exists()
    (retriever / "retriever.json").unlink()  # lost (of a shared encoder: no passage/ to tell it by): not read
    shutil.rmtree(retriever / "passage")  # as a plain encoder with the default options
    with pytest.raises(CheckpointError, match=r"retriever\.json: missing, though .*config\.json records"):
        BiEncoder.from_dir(retriever)


def test_a_retriever_json_written_before_passage_encoder_was_recorded_still_reads(retriever):
    saved = json.loads((retriever / "retriever.json").read_text())
    del saved["passage_encoder"]
    (retriever / "retriever.json").write_text(json.dumps(saved))
    config = json.loads((retriever / "config.json").read_text())
    del config["sha256"]["retriever.json"]  # nor its checksum recorded then: it reads unverified
    (retriever / "config.json").write_text(json.dumps(config))
    assert BiEncoder.from_dir(retriever).passage_model is not None  # passage/ says so
    (retriever / "passage" / "model.safetensors").unlink()
    with pytest.raises(ValueError, match=r"passage"):
        BiEncoder.from_dir(retriever)


def test_saving_into_a_link_is_refused_and_its_target_left_alone(saved, tmp_path):
    from lmforge.utils.atomic import UnsafePath

    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    with pytest.raises(UnsafePath, match="link: is a symbolic link"):
        BiEncoder.from_dir(saved[1]).save(tmp_path / "link")
    assert list((tmp_path / "elsewhere").iterdir()) == []
