import json
import os

import pytest
import torch

import lmforge
from lmforge.heads import attach
from lmforge.io import CheckpointError


READERS = ((lmforge.load, CheckpointError), (lmforge.load_tokenizer, lmforge.tokenizer.TokenizerError))


@pytest.fixture
def saved(tmp_path):
    model = lmforge.build(lmforge.tiny("bert-base"))
    attach(model, "lm")
    model.save(tmp_path)
    return tmp_path


def test_writes_safetensors_and_json(saved):
    meta = json.loads((saved / "config.json").read_text())
    assert meta["format"] == "lmforge" and meta["heads"] == {"lm": {"kind": "lm"}}
    assert (saved / "model.safetensors").is_file()
    assert not [p for p in saved.iterdir() if p.name.startswith(".")]  # no temporary files left


def test_a_flipped_byte_of_the_weights_is_refused_by_their_checksum(saved):
    """safetensors checks the layout, not the numbers: a byte changed inside a tensor would load as other
    weights. config.json records the file's sha256, and a load verifies it."""
    weights = saved / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-5] ^= 0x01  # inside the last tensor's bytes: the layout is intact
    weights.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=rf"^{weights} does not match its checksum in config.json"):
        lmforge.load(saved)


def test_a_folder_written_without_checksums_still_loads_and_a_bad_field_is_refused(saved):
    meta = json.loads((saved / "config.json").read_text())
    assert set(meta["sha256"]) == {"model.safetensors"}
    (saved / "config.json").write_text(json.dumps({k: v for k, v in meta.items() if k != "sha256"}))
    lmforge.load(saved)  # written before checksums were recorded: nothing to check
    (saved / "config.json").write_text(json.dumps({**meta, "sha256": ["not", "a", "mapping"]}))
    with pytest.raises(CheckpointError, match='config.json: "sha256" must map file names to checksums'):
        lmforge.load(saved)


def test_missing_directory_or_files(tmp_path):
    with pytest.raises(CheckpointError, match="config.json is missing"):
        lmforge.load(tmp_path)


def test_an_empty_model_name_is_refused_not_read_as_the_working_folder(saved, monkeypatch):
    from lmforge.io import find_model_dir

    monkeypatch.chdir(saved)  # a model directory: "" loaded it, as if named
    for reader in (*(load for load, _ in READERS), find_model_dir):
        for name in ("", " "):  # no name at all, as None: the argument's refusal, not a damaged model
            with pytest.raises(lmforge.OptionsError,
                               match="^the model is an empty name: give a model directory") as caught:
                reader(name)
            assert caught.value.field == "model" and not isinstance(caught.value, CheckpointError)


@pytest.mark.parametrize("name", [None, 3])
def test_what_is_no_model_name_at_all_is_an_options_error_naming_model_on_both_readers(name):
    """lmforge.load(None) retyped find_model_dir's OptionsError as a CheckpointError (and load_tokenizer as a
    TokenizerError), where embed, fill_mask and find_model_dir itself name the argument: no path at all is
    the caller's option, not a damaged model."""
    for load, _ in READERS:
        with pytest.raises(lmforge.OptionsError,
                           match="^the model must be a directory or an installed model") as caught:
            load(name)
        assert caught.value.field == "model" and not isinstance(caught.value, CheckpointError)


BERT = {"model_type": "bert", "vocab_size": 50, "hidden_size": 32, "num_hidden_layers": 1,
        "num_attention_heads": 2, "intermediate_size": 64, "max_position_embeddings": 64}


@pytest.mark.parametrize("config, message", [
    ({"hidden_size": 768}, "neither an lmforge model directory"),
    ({"model_type": "bert", "hidden_size": 768}, "lacks the field 'vocab_size'"),
    ({"model_type": "whisper"}, "model_type 'whisper' is not supported"),
    ({"model_type": ["bert"]}, r"model_type \['bert'\] is not supported"),  # a list was 'unhashable type'
    ({**BERT, "hidden_act": {"gelu": 1}}, r"hidden_act=\{'gelu': 1\} is not supported"),
    ({**BERT, "architectures": "BertModel"}, "architectures must be a list of class names, got 'BertModel'"),
    ({**BERT, "architectures": [["BertModel"]]}, "architectures must be a list of class names"),
])
def test_foreign_config_is_refused(saved, config, message):
    (saved / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=message):
        lmforge.load(saved)


def test_non_utf8_config_is_refused(saved):
    (saved / "config.json").write_bytes(b"\xff\xfe{")
    with pytest.raises(CheckpointError, match=r"config.json is not UTF-8 text \(byte 0\)"):
        lmforge.load(saved)


def test_corrupt_weights_are_refused(saved):
    (saved / "model.safetensors").write_bytes(b"\x00" * 64)
    with pytest.raises(CheckpointError, match="cannot read weights"):
        lmforge.load(saved)


def test_mismatched_weights_are_named(saved, tmp_path_factory):
    other = tmp_path_factory.mktemp("other")
    lmforge.build(lmforge.tiny("bert-base", d_ff=48)).save(other)
    (saved / "model.safetensors").replace(saved / "keep.safetensors")
    (other / "model.safetensors").replace(saved / "model.safetensors")
    with pytest.raises(CheckpointError) as err:
        lmforge.load(saved)
    message = str(err.value)
    assert "missing: ['heads.lm.bias'" in message
    assert "wrong shape: ['encoder.blocks.0.ffn.down.weight (32, 48) != (32, 64)'" in message


def test_invalid_config_in_checkpoint(saved):
    meta = json.loads((saved / "config.json").read_text())
    meta["config"]["n_heads"] = 5
    (saved / "config.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="d_model=32 is not divisible by n_heads=5"):
        lmforge.load(saved)


def test_loaded_model_matches(saved):
    model = lmforge.load(saved).eval()
    assert model(torch.randint(0, 99, (1, 5))).logits.shape == (1, 5, 99)


def test_truncated_weights_name_the_file_and_the_cause(saved):
    weights = saved / "model.safetensors"
    size = weights.stat().st_size
    weights.write_bytes(weights.read_bytes()[:size // 2])
    with pytest.raises(CheckpointError, match=f"{weights}: truncated: {size // 2} of {size} bytes"):
        lmforge.load(saved)


def test_a_full_disk_on_save_is_named_and_leaves_no_partial_file(saved, monkeypatch, tmp_path_factory):
    import errno

    import lmforge.io.files as files

    import shutil

    earlier = shutil.copytree(saved, tmp_path_factory.mktemp("earlier") / "model")  # saved there before
    before = (earlier / "model.safetensors").read_bytes()

    def no_space(*args, **kw):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(files, "save_file", no_space)
    with pytest.raises(files.DiskFull) as caught:
        lmforge.load(saved).save(earlier)
    assert str(caught.value) == f"no space left on device writing {earlier / 'model.safetensors'}"
    assert not [p for p in earlier.iterdir() if p.name.startswith(".")]
    assert (earlier / "model.safetensors").read_bytes() == before  # the old weights are untouched


@pytest.mark.parametrize("field, value, message", [
    ("heads", "lm", 'field "heads" must be a mapping of head name'),
    ("heads", ["lm"], 'field "heads" must be a mapping of head name'),
    ("heads", {"lm": "lm"}, 'heads.lm must be a mapping with a "kind"'),
    ("heads", {"lm": {"size": 3}}, 'heads.lm must be a mapping with a "kind"'),
    ("heads", {"lm": {"kind": "magic"}}, "heads.lm: head kind 'magic' is not one of"),
    ("heads", {"lm": {"kind": "lm", "size": 3}}, "heads.lm: "),
    ("heads", {"keys": {"kind": "lm"}}, "heads.keys: not usable as a head name"),
    ("config", "bert", 'field "config" must be a mapping'),
])
def test_malformed_config_fields_are_named_in_one_line(saved, capsys, field, value, message):
    from lmforge.cli import main

    meta = json.loads((saved / "config.json").read_text())
    meta[field] = value
    (saved / "config.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError) as err:
        lmforge.load(saved)
    assert str(saved / "config.json") in str(err.value) and message in str(err.value)
    assert main(["inspect", str(saved)]) == 2
    printed = capsys.readouterr().err
    assert printed.count("\n") == 1 and "Traceback" not in printed and message in printed


def test_a_config_that_is_not_json_is_named_with_the_cause(saved):
    (saved / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError) as err:
        lmforge.load(saved)
    assert str(err.value).startswith(f"{saved / 'config.json'} is not valid JSON: Expecting property name")


def test_a_config_that_is_not_a_json_object_is_named(saved):
    (saved / "config.json").write_text("[1, 2]")
    with pytest.raises(CheckpointError,
                       match=r"config.json must hold a JSON object \{...\}, not list \[1, 2\]"):
        lmforge.load(saved)


@pytest.mark.parametrize("fmt", ["lmforge", "hf"])
def test_save_refuses_a_target_it_would_write_through_or_over_and_writes_nothing(tmp_path, monkeypatch, fmt):
    import lmforge.convert  # noqa: F401 (registers the hf writer)

    model = lmforge.build(lmforge.tiny("bert-base"))
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to("real")
    (tmp_path / "file").write_text("x")
    monkeypatch.chdir(tmp_path)
    for target, said in (("link", "is a symbolic link"), ("file", "exists and is not a folder"),
                         ("", "path is empty"), (" ", "path is empty")):
        with pytest.raises(lmforge.OptionsError, match=said) as refused:
            lmforge.save(model, target, format=fmt)
        assert refused.value.field == "path"
    with pytest.raises(lmforge.OptionsError, match="^state must be a mapping") as refused:
        lmforge.save(model, "new", format=fmt, state=["weights"])
    assert refused.value.field == "state"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "link", "real"]
    assert not any((tmp_path / "real").iterdir())  # nothing written where the link points


def test_load_and_load_tokenizer_read_an_installed_model_by_name_as_every_command_s_model_does(tmp_path):
    from lmforge.io import find_model_dir

    where = find_model_dir("all-MiniLM-L6-v2")
    model = lmforge.load("sentence-transformers/all-MiniLM-L6-v2")  # the hub's name, as HF users write it
    same = lmforge.load(where)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), same.state_dict().values()))
    text = "Installed models load by name."
    assert lmforge.load_tokenizer("all-MiniLM-L6-v2").encode(text).ids == \
        lmforge.load_tokenizer(where).encode(text).ids
    for name, said in (("bert-base", "is a preset"), (str(tmp_path / "nope"), "neither a model directory"),
                       ("elmo-small", "is an ELMo preset: pretrain it first")):
        for load, error in READERS:
            with pytest.raises(error, match=said):
                load(name)


def test_both_formats_load_in_eval_mode_as_from_pretrained_does(tmp_path):
    import lmforge.convert  # noqa: F401 (registers the hf format)

    model = lmforge.build(lmforge.tiny("bert-base"))  # built in training mode
    for fmt in ("lmforge", "hf"):
        loaded = lmforge.load(lmforge.save(model, tmp_path / fmt, format=fmt))
        assert not any(m.training for m in loaded.modules()), fmt  # an lmforge directory came back training


def test_a_model_that_is_no_name_nor_folder_is_refused_in_one_line_on_every_python_face():
    """None or a number for `model` failed inside pathlib (TypeError) on embed and features, and a name
    that resolves to nothing was said as the command line's --model from Python (a helper's probe)."""
    from lmforge.config.options import OptionsError
    from lmforge.io import find_model_dir
    from lmforge.tasks.finetune import load_model

    for bad in (None, 3):
        with pytest.raises(ValueError, match=f"^the model must be a directory or an installed model's name, "
                                             f"got {type(bad).__name__}$"):
            find_model_dir(bad)
        with pytest.raises(ValueError, match="^the model must be a directory"):
            lmforge.embed(["a text"], model=bad)
    with pytest.raises(OptionsError, match="^model 'nope' is neither a model directory, an installed") as err:
        load_model("nope")
    assert err.value.field == "model"
    with pytest.raises(OptionsError, match="^model must be a model, a model directory or a preset name"):
        load_model(3)


def test_a_tokenizer_named_by_the_user_is_found_one_way_on_every_face(tmp_path):
    """lmforge.load_tokenizer, the jobs' tokenizer= and fine-tuning's --tokenizer read a name through
    io.find_tokenizer: an installed model's name resolves for fine-tuning too (it was read as a folder)."""
    from lmforge.config.options import OptionsError
    from lmforge.io import find_tokenizer
    from lmforge.io.resolve import checked_tokenizer
    from lmforge.tasks.finetune import load_model
    from lmforge.tokenizer import TokenizerError

    want = lmforge.load_tokenizer("all-MiniLM-L6-v2").backend.get_vocab()
    assert checked_tokenizer("all-MiniLM-L6-v2").backend.get_vocab() == want
    model = lmforge.build("bert-base", n_layers=1, d_model=32, n_heads=2, d_ff=64, vocab_size=len(want))
    assert load_model(model, "all-MiniLM-L6-v2")[1].backend.get_vocab() == want
    with pytest.raises(TokenizerError, match="is neither a model directory"):
        find_tokenizer(tmp_path / "none")
    with pytest.raises(OptionsError, match="^tokenizer: "):
        checked_tokenizer(tmp_path / "none")


@pytest.mark.parametrize("name", ["generation_config.json", "tokenizer.json", "model.safetensors"])
def test_a_fifo_in_a_model_directory_is_refused_naming_it_not_waited_on(tmp_path, name):
    lmforge.build(lmforge.tiny("bert-base")).save(tmp_path)
    (tmp_path / name).unlink(missing_ok=True)
    os.mkfifo(tmp_path / name)  # opening it to read waits for a writer that never comes (load hung)
    with pytest.raises(CheckpointError, match=rf"{name} is not a regular file \(a named pipe \(FIFO\)\)"):
        lmforge.load(tmp_path)


@pytest.mark.parametrize("path", [None, 3, b"out"])
def test_save_to_a_path_that_is_no_name_is_an_options_error_naming_path(tmp_path, path):
    """None, a number or bytes as save's path failed inside pathlib as a TypeError."""
    model = lmforge.build(lmforge.tiny("gpt2"))
    with pytest.raises(lmforge.OptionsError, match="path must be a folder's name") as caught:
        lmforge.save(model, path)
    assert caught.value.field == "path"
    with pytest.raises(lmforge.OptionsError, match="path must be a folder's name"):
        model.save(path)


@pytest.mark.parametrize("model", [None, "gpt2", torch.nn.Linear(2, 2)])
def test_save_of_no_lmforge_model_is_an_options_error_writing_nothing(tmp_path, model):
    """None or a preset name as save's model failed as "'NoneType' object has no attribute 'state_dict'"."""
    with pytest.raises(lmforge.OptionsError, match="model must be an lmforge model") as caught:
        lmforge.save(model, tmp_path / "out")
    assert caught.value.field == "model" and not (tmp_path / "out").exists()


def test_a_model_name_s_refusals_are_typed_on_every_python_face(saved, tmp_path):
    """find_model_dir's refusals were plain ValueErrors, which lmforge.load alone retyped: what is no name is
    an OptionsError naming model, a name of no model a CheckpointError; save's unknown format names format."""
    from lmforge.config.options import OptionsError
    from lmforge.io import find_model_dir

    for name, said in ((None, "must be a directory"), ("", "is an empty name")):
        with pytest.raises(OptionsError, match=f"^the model {said}") as err:
            find_model_dir(name)
        assert err.value.field == "model"
    for name in ("nope-dir", "bert-base"):
        with pytest.raises(CheckpointError):
            find_model_dir(name)
    with pytest.raises(OptionsError, match=r"^format='onnx' is not one of lmforge") as err:
        lmforge.save(lmforge.load(saved), tmp_path / "out", format="onnx")
    assert err.value.field == "format"
