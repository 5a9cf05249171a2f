"""lmforge.save never writes over the folder the model was read from, as the CLI never writes over its
input."""
import os

import pytest

import lmforge
from lmforge.utils.atomic import UnsafePath


@pytest.mark.parametrize("format", ["lmforge", "hf"])
def test_saving_into_the_folder_loaded_from_is_refused_naming_it(tmp_path, format):
    """lmforge.load(d).save(d, format="hf") rewrote d in place, its weights and config.json replaced."""
    lmforge.build(lmforge.tiny("bert-base")).save(tmp_path / "m")
    before = {p.name: p.read_bytes() for p in (tmp_path / "m").iterdir()}
    model = lmforge.load(tmp_path / "m")
    with pytest.raises(UnsafePath, match=f"^path {tmp_path / 'm'}: is the folder the model was loaded from") \
            as refused:
        lmforge.save(model, tmp_path / "m", format=format)
    assert refused.value.field == "path" and "\n" not in str(refused.value)
    assert {p.name: p.read_bytes() for p in (tmp_path / "m").iterdir()} == before


def test_the_same_folder_by_another_name_is_refused_too(tmp_path):
    """../ and a link to a folder above it are seen through (a link as the folder itself is refused as
    a link)."""
    lmforge.build(lmforge.tiny("bert-base")).save(tmp_path / "m")
    model = lmforge.load(tmp_path / "m")
    os.symlink(tmp_path, tmp_path / "up")
    for other in (tmp_path / "x" / ".." / "m", tmp_path / "up" / "m"):
        with pytest.raises(UnsafePath, match="loaded from"):
            model.save(other)


def test_a_job_folders_model_is_refused_where_it_lies_and_other_folders_are_written(tmp_path):
    """Loaded from a job's --out folder, the model read is OUT/final: that is the input; OUT/copy is not."""
    lmforge.build(lmforge.tiny("bert-base")).save(tmp_path / "job" / "final")
    model = lmforge.load(tmp_path / "job")
    with pytest.raises(UnsafePath, match="loaded from"):
        model.save(tmp_path / "job" / "final")
    model.save(tmp_path / "job" / "copy")
    assert lmforge.load(tmp_path / "job" / "copy").config == model.config


def test_a_file_a_load_reads_inside_the_folder_loaded_from_is_refused_and_a_new_folder_is_not(tmp_path):
    """writes_over's rule, the CLI's: a folder named as one of the model's files (its vocab.txt) is refused,
    a folder of another name inside it written."""
    lmforge.build(lmforge.tiny("bert-base")).save(tmp_path / "m")
    model = lmforge.load(tmp_path / "m")
    with pytest.raises(UnsafePath, match="is a file a load reads from the folder the model was loaded from"):
        model.save(tmp_path / "m" / "vocab.txt")
    assert not (tmp_path / "m" / "vocab.txt").exists()
    model.save(tmp_path / "m" / "copy")
    assert lmforge.load(tmp_path / "m" / "copy").config == model.config
