"""A job's output folder is read wherever a model directory is: lmforge.load, the tokenizer, the
embedding job, --model of every command (issue 43: `quantize --out DIR` then `from_dir(DIR)`)."""
import pytest
import torch

import lmforge
from lmforge.io import find_model_dir
from lmforge.pipelines.embed import SentenceEncoder
from tests.serve.conftest import _save, _tiny, _tokenizer


@pytest.mark.parametrize("inner", ["model", "final"])  # quantize / prune; pretrain / finetune / distill
def test_every_loader_reads_a_jobs_output_folder(tmp_path, inner):
    tokenizer = _tokenizer("bert")
    _save(_tiny("bert-base", tokenizer, 3, max_seq_len=32), tokenizer, tmp_path / "run" / inner)
    run = tmp_path / "run"
    assert find_model_dir(run) == run / inner
    same = lmforge.load(run / inner)
    assert all(torch.equal(a, b) for a, b in zip(lmforge.load(run).state_dict().values(),
                                                 same.state_dict().values()))
    assert lmforge.load_tokenizer(run).vocab_size == tokenizer.vocab_size
    vectors = SentenceEncoder.from_dir(run).encode(["the cat sat"])
    assert vectors.shape[0] == 1 and torch.isfinite(vectors).all()


def test_a_folder_with_a_model_of_its_own_is_read_as_it_is(tmp_path):
    tokenizer = _tokenizer("bert")
    _save(_tiny("bert-base", tokenizer, 3, max_seq_len=32), tokenizer, tmp_path / "m")
    _save(_tiny("bert-base", tokenizer, 4, max_seq_len=32), tokenizer, tmp_path / "m" / "final")
    assert find_model_dir(tmp_path / "m") == tmp_path / "m"


def test_files_written_beside_a_model_are_recorded_in_its_config_and_checked(tmp_path):
    """record_sums adds each file's checksum to config.json's map (the weights' one kept); check_recorded
    names a changed or lost file, and says nothing of one never recorded or of a folder that is no lmforge
    model's (a Hugging Face config.json, none at all)."""
    import json

    from lmforge.utils.model_folder import check_recorded, record_sums

    _save(_tiny("bert-base", _tokenizer("bert"), 3, max_seq_len=32), _tokenizer("bert"), tmp_path / "m")
    (tmp_path / "m" / "extra.json").write_text('{"a": 1}')
    record_sums(tmp_path / "m", ["extra.json", "absent.json"])
    sums = json.loads((tmp_path / "m" / "config.json").read_text())["sha256"]
    assert set(sums) == {"model.safetensors", "tokenizer.json", "tokenizer_config.json", "extra.json"}
    check_recorded(tmp_path / "m", "extra.json")
    check_recorded(tmp_path / "m", "absent.json")  # never recorded: nothing to check
    (tmp_path / "m" / "extra.json").write_text('{"a": 2}')
    with pytest.raises(ValueError, match=r"extra\.json does not match its checksum in config\.json"):
        check_recorded(tmp_path / "m", "extra.json")
    (tmp_path / "m" / "extra.json").unlink()
    with pytest.raises(ValueError, match=r"extra\.json: missing, though .*config\.json records its checksum"):
        check_recorded(tmp_path / "m", "extra.json")
    for config in ('{"model_type": "bert"}', None):  # a Hugging Face folder, a tokenizer folder alone
        (tmp_path / "other").mkdir(exist_ok=True)
        (tmp_path / "other" / "extra.json").write_text("{}")
        if config:
            (tmp_path / "other" / "config.json").write_text(config)
        else:
            (tmp_path / "other" / "config.json").unlink()
        record_sums(tmp_path / "other", ["extra.json"])
        check_recorded(tmp_path / "other", "extra.json")
        assert (tmp_path / "other" / "config.json").exists() == bool(config)
        assert config is None or (tmp_path / "other" / "config.json").read_text() == config


def test_a_file_edited_on_purpose_reads_again_once_its_entry_is_dropped_as_the_error_says(tmp_path):
    import json

    from lmforge.utils.model_folder import check_recorded

    _save(_tiny("bert-base", _tokenizer("bert"), 3, max_seq_len=32), _tokenizer("bert"), tmp_path / "m")
    config = tmp_path / "m" / "tokenizer_config.json"
    config.write_text(config.read_text().replace("{", '{"model_max_length": 16, ', 1))
    hint = r"drop tokenizer_config\.json from config\.json's \"sha256\""
    with pytest.raises(ValueError, match=hint) as said:
        check_recorded(tmp_path / "m", "tokenizer_config.json")
    assert "\n" not in str(said.value)
    meta = json.loads((tmp_path / "m" / "config.json").read_text())
    del meta["sha256"]["tokenizer_config.json"]
    (tmp_path / "m" / "config.json").write_text(json.dumps(meta))
    assert lmforge.load_tokenizer(tmp_path / "m").model_max_length == 16


def test_an_unreadable_recorded_file_is_the_callers_error_naming_it(tmp_path, monkeypatch):
    """A recorded file that cannot be read (root reads through chmod 000, so the read is made to fail) is
    the caller's one-line error naming it, not a bare PermissionError."""
    import lmforge.utils.model_folder as model_folder

    _save(_tiny("bert-base", _tokenizer("bert"), 3, max_seq_len=32), _tokenizer("bert"), tmp_path / "m")

    def refused(path):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(model_folder, "sha256", refused)
    with pytest.raises(KeyError, match=r"cannot read .*tokenizer_config\.json: Permission denied"):
        model_folder.check_recorded(tmp_path / "m", "tokenizer_config.json", error=KeyError)
