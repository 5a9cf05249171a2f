"""lmforge/atomic.replace_dir: a folder replaced whole, nothing beside it touched, a failure changes
nothing, what a killed call left tidied (files' modes: tests/test_config.py)."""
import os
import subprocess
import sys

import pytest

from lmforge.atomic import replace_dir


def test_an_existing_folder_is_replaced_whole_and_nothing_beside_it_is_touched(tmp_path):
    dest = tmp_path / "out" / "model"
    (dest / "1_Pooling").mkdir(parents=True)
    (dest / "keep.txt").write_text("the user's")
    (dest / "config.json").write_text("old")
    beside = [tmp_path / "out" / "model.partial", tmp_path / "out" / "notes.txt"]
    for path in beside:
        path.write_text("not the model")
    assert replace_dir(dest, lambda d: (d / "config.json").write_text("new")) is True
    assert sorted(p.name for p in dest.iterdir()) == ["config.json"]
    assert (dest / "config.json").read_text() == "new"
    assert all(p.read_text() == "not the model" for p in beside)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["model", "model.partial", "notes.txt"]
    assert replace_dir(tmp_path / "fresh" / "model", lambda d: None) is False


def test_a_failed_write_leaves_the_old_folder_and_no_staging(tmp_path):
    dest = tmp_path / "model"
    dest.mkdir()
    (dest / "config.json").write_text("old")

    def broken(folder):
        (folder / "config.json").write_text("half")
        raise ValueError("failed")

    with pytest.raises(ValueError):
        replace_dir(dest, broken)
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
        replace_dir(dest, lambda folder: (folder / "config.json").write_text("new"))
    assert [p.name for p in tmp_path.iterdir()] == ["model"] and (dest / "config.json").read_text() == "old"


def test_a_link_is_replaced_not_what_it_points_to(tmp_path):
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "data.txt").write_text("keep")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "model").symlink_to(target)
    assert replace_dir(tmp_path / "out" / "model", lambda d: None) is True
    assert not (tmp_path / "out" / "model").is_symlink() and (target / "data.txt").read_text() == "keep"


def _dead_pid() -> int:
    """The id of a process that has exited."""
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                           text=True, check=True)
    return int(child.stdout)


def test_what_a_killed_write_left_is_tidied_and_a_live_one_is_not(tmp_path):
    dest, dead = tmp_path / "model", _dead_pid()
    (tmp_path / f".model.new-{dead}-abc").mkdir()  # killed while writing
    (tmp_path / ".model.new-xyz").mkdir()  # from before the writer's id was in the name
    live = tmp_path / f".model.new-{os.getpid()}-live"  # another thread of this process, writing now
    live.mkdir()
    assert replace_dir(dest, lambda d: (d / "config.json").write_text("new")) is False
    assert sorted(p.name for p in tmp_path.iterdir()) == [live.name, "model"]


def test_a_call_killed_between_its_renames_gets_the_old_folder_back_first(tmp_path):
    dead = _dead_pid()
    old, new = tmp_path / f".model.old-{dead}-abc", tmp_path / f".model.new-{dead}-abc"
    for folder, text in ((old, "old"), (new, "new, never put in place")):
        folder.mkdir()
        (folder / "config.json").write_text(text)
    seen = []
    replace_dir(tmp_path / "model", lambda d: seen.append((tmp_path / "model" / "config.json").read_text()))
    assert seen == ["old"] and sorted(p.name for p in tmp_path.iterdir()) == ["model"]
