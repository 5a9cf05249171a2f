"""Tokenizer.save refuses what model.save refuses (an empty name, a symbolic link, a file as its folder),
with the same exception naming the path, and never writes where a link points."""
import pytest

import lmforge
from lmforge.config.options import OptionsError
from lmforge.utils.atomic import UnsafePath  # an OptionsError, as every link refusal is
from tests.tasks.core import tiny, tokenizer


def _plant(tmp_path, dangling: bool):
    target = tmp_path / "elsewhere"
    if not dangling:
        target.mkdir()
    (tmp_path / "tok").symlink_to(target, target_is_directory=True)
    return target


@pytest.mark.parametrize("dangling", [False, True])
def test_a_link_as_the_folder_is_refused_naming_it_as_model_save_refuses_it(tmp_path, dangling):
    target = _plant(tmp_path, dangling)
    said = f"^path {tmp_path / 'tok'}: is a symbolic link; a tokenizer directory is never written through one"
    with pytest.raises(UnsafePath, match=said) as err:
        tokenizer().save(tmp_path / "tok")
    assert err.value.field == "path" and "\n" not in str(err.value) and isinstance(err.value, OptionsError)
    assert (list(target.iterdir()) == []) if not dangling else not target.exists()
    with pytest.raises(UnsafePath, match="is a symbolic link; a model directory is never written through"):
        lmforge.save(tiny(), tmp_path / "tok")  # the same refusal for the model beside it


def test_an_empty_name_or_a_file_is_refused_naming_it_and_a_folder_is_written(tmp_path):
    with pytest.raises(OptionsError, match="^path is empty: name the tokenizer directory"):
        tokenizer().save("")
    (tmp_path / "file").write_text("the user's")
    with pytest.raises(OptionsError, match=f"^path {tmp_path / 'file'}: exists and is not a folder"):
        tokenizer().save(tmp_path / "file")
    assert (tmp_path / "file").read_text() == "the user's"
    saved = tokenizer().save(tmp_path / "new" / "tok")
    assert sorted(p.name for p in saved.iterdir()) == ["tokenizer.json", "tokenizer_config.json"]
