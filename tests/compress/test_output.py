"""OUT/model written whole: a fresh folder replaces the old one entirely, nothing beside it is touched,
a failure changes nothing, and carried files get the mode a new file has under the umask."""
import os
import stat

import pytest

from lmforge.compress.output import carry_sentence_files, replace_model_dir


def _mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_an_existing_folder_is_replaced_whole_and_nothing_beside_it_is_touched(tmp_path):
    dest = tmp_path / "out" / "model"
    (dest / "1_Pooling").mkdir(parents=True)
    (dest / "keep.txt").write_text("the user's")
    (dest / "config.json").write_text("old")
    beside = [tmp_path / "out" / "model.partial", tmp_path / "out" / "notes.txt"]
    for path in beside:
        path.write_text("not the model")
    assert replace_model_dir(dest, lambda d: (d / "config.json").write_text("new")) is True
    assert sorted(p.name for p in dest.iterdir()) == ["config.json"]
    assert (dest / "config.json").read_text() == "new"
    assert all(p.read_text() == "not the model" for p in beside)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["model", "model.partial", "notes.txt"]
    assert replace_model_dir(tmp_path / "fresh" / "model", lambda d: None) is False


def test_a_failed_write_leaves_the_old_folder_and_no_staging(tmp_path):
    dest = tmp_path / "model"
    dest.mkdir()
    (dest / "config.json").write_text("old")

    def broken(folder):
        (folder / "config.json").write_text("half")
        raise ValueError("failed")

    with pytest.raises(ValueError):
        replace_model_dir(dest, broken)
    assert [p.name for p in tmp_path.iterdir()] == ["model"] and (dest / "config.json").read_text() == "old"


def test_a_failed_move_into_place_puts_the_old_folder_back(tmp_path, monkeypatch):
    dest = tmp_path / "model"
    dest.mkdir()
    (dest / "config.json").write_text("old")
    real, calls = os.replace, []

    def second_fails(a, b):  # moving the old folder aside works, moving the new one in does not
        calls.append((a, b))
        if len(calls) == 2:
            raise OSError("disk gone")
        return real(a, b)

    monkeypatch.setattr(os, "replace", second_fails)
    with pytest.raises(OSError):
        replace_model_dir(dest, lambda folder: (folder / "config.json").write_text("new"))
    assert [p.name for p in tmp_path.iterdir()] == ["model"] and (dest / "config.json").read_text() == "old"


def test_a_link_is_replaced_not_what_it_points_to(tmp_path):
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "data.txt").write_text("keep")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "model").symlink_to(target)
    assert replace_model_dir(tmp_path / "out" / "model", lambda d: None) is True
    assert not (tmp_path / "out" / "model").is_symlink() and (target / "data.txt").read_text() == "keep"


@pytest.mark.parametrize("mask", [0o077, 0o022])
def test_carried_files_and_the_folder_get_the_umask_mode_not_the_source_mode(tmp_path, mask):
    source = tmp_path / "st"
    (source / "1_Pooling").mkdir(parents=True)
    for path in (source / "modules.json", source / "1_Pooling" / "config.json"):
        path.write_text("{}")
        os.chmod(path, 0o600 if mask == 0o022 else 0o644)  # the source's mode is not the copy's
    before = os.umask(mask)
    try:
        replace_model_dir(tmp_path / "model", lambda d: carry_sentence_files(source, d))
    finally:
        os.umask(before)
    dest = tmp_path / "model"
    assert _mode(dest) == _mode(dest / "1_Pooling") == 0o777 & ~mask
    assert _mode(dest / "modules.json") == _mode(dest / "1_Pooling" / "config.json") == 0o666 & ~mask
