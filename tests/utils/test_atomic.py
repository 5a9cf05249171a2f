"""lmforge/atomic: a folder replaced whole, nothing beside it touched, a failure changes nothing, what a
killed call left tidied (files' modes: tests/test_config.py); files, figures and appended lines never
written through a link planted at their path."""
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lmforge.utils.atomic import (UnsafePath, append_text, atomic_savefig, atomic_write, atomic_write_text,
                                  file_kind, identity, replace_dir, writable_folder, writes_over)


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


def _planted(tmp_path, name):
    """A link at tmp_path/out/name to a file holding "the user's", and that file."""
    target = tmp_path / "precious.txt"
    target.write_text("the user's")
    (tmp_path / "out").mkdir(exist_ok=True)
    (tmp_path / "out" / name).symlink_to(target)
    return tmp_path / "out" / name, target


def test_a_file_written_over_a_link_replaces_the_link_not_its_target(tmp_path):
    link, target = _planted(tmp_path, "predictions.jsonl")
    atomic_write_text(link, "new\n")
    assert not link.is_symlink() and link.read_text() == "new\n" and target.read_text() == "the user's"
    assert sorted(p.name for p in link.parent.iterdir()) == ["predictions.jsonl"]  # no temporary left


def test_a_failed_write_leaves_the_file_as_it_was_and_no_temporary(tmp_path):
    path = tmp_path / "out.bin"
    path.write_bytes(b"old")

    def broken(handle):
        handle.write(b"half")
        raise ValueError("failed")

    with pytest.raises(ValueError):
        atomic_write(path, broken)
    assert path.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["out.bin"]


def test_an_append_refuses_a_link_in_one_line_naming_it_and_appends_to_a_file(tmp_path):
    link, target = _planted(tmp_path, "metrics.jsonl")
    with pytest.raises(UnsafePath, match=f"^{link}: is a symbolic link; refusing to write through it"):
        append_text(link, "{}\n")
    assert target.read_text() == "the user's"
    plain = tmp_path / "out" / "log.jsonl"
    append_text(plain, "a\n")
    append_text(plain, "b\n")
    assert plain.read_text() == "a\nb\n"


def test_a_figure_is_saved_whole_over_a_link_without_touching_its_target(tmp_path):
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    link, target = _planted(tmp_path, "loss.png")
    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    atomic_savefig(fig, link, dpi=50)
    plt.close(fig)
    assert not link.is_symlink() and link.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert target.read_text() == "the user's"

def test_a_folder_or_a_path_under_a_file_is_refused_in_one_line(tmp_path):
    from lmforge.utils.atomic import UnsafePath, atomic_write_text

    (tmp_path / "dir").mkdir()
    (tmp_path / "plain").write_text("kept")
    with pytest.raises(UnsafePath, match="dir: is a folder, not a file$"):
        atomic_write_text(tmp_path / "dir", "x")
    with pytest.raises(UnsafePath, match="plain is a file, not a folder$"):
        atomic_write_text(tmp_path / "plain" / "sub" / "out.json", "x")
    (tmp_path / "gone").symlink_to(tmp_path / "nowhere")
    with pytest.raises(UnsafePath, match="gone is a symbolic link to nothing, not a folder$"):
        atomic_write_text(tmp_path / "gone" / "out.json", "x")
    assert not (tmp_path / "nowhere").exists()
    assert (tmp_path / "plain").read_text() == "kept" and list((tmp_path / "dir").iterdir()) == []


def test_a_place_that_cannot_be_written_is_named_as_asked_not_by_a_temporary_name(tmp_path):
    """The error of an output that cannot be made names the output (and the file in the way), never the
    hidden temporary name beside it that the user did not ask for."""
    (tmp_path / "a-file").write_text("in the way")
    with pytest.raises(FileNotFoundError) as err:  # /proc takes no new file: the temporary one fails
        atomic_write_text("/proc/x.npy", "x")
    assert str(err.value).endswith("'/proc/x.npy'") and "/." not in str(err.value)
    with pytest.raises(FileNotFoundError) as err:
        replace_dir("/proc/model", lambda folder: None)
    assert str(err.value).endswith("'/proc/model'") and "/." not in str(err.value)
    with pytest.raises(FileNotFoundError) as err:  # a folder on the way: named, with the output
        atomic_write_text("/proc/no-such-dir/x.npy", "x")
    assert "(writing /proc/no-such-dir/x.npy): '/proc/no-such-dir'" in str(err.value)
    with pytest.raises(FileExistsError) as err:
        replace_dir(tmp_path / "a-file" / "model", lambda folder: None)
    assert f"writing {tmp_path / 'a-file' / 'model'}" in str(err.value) and "a-file'" in str(err.value)


FORMATS = ["svg", "pdf", "png"]


def _figure(path: Path) -> bytes:
    """A small figure saved to `path`; its bytes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.imshow([[1, 2], [3, 4]])
    ax.set_title("attention")
    try:
        return atomic_savefig(fig, path).read_bytes()
    finally:
        plt.close(fig)


@pytest.fixture(scope="module")
def first_saves(tmp_path_factory):
    """Each format's figure saved once, and when: one wait of a second serves the three second saves."""
    folder = tmp_path_factory.mktemp("figures")
    return {fmt: _figure(folder / f"0.{fmt}") for fmt in FORMATS}, time.monotonic()


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_figure_saved_twice_is_the_same_bytes(tmp_path, fmt, first_saves):
    """No date and no random element ids in a saved figure: the same run draws the same file."""
    saved, when = first_saves
    time.sleep(max(0.0, when + 1.1 - time.monotonic()))  # a date stamped in would differ: seconds apart
    assert _figure(tmp_path / f"1.{fmt}") == saved[fmt]


def test_files_are_put_in_place_all_or_none_and_the_folders_other_files_stay(tmp_path):
    from lmforge.utils.atomic import replace_files

    dest = tmp_path / "tok"
    dest.mkdir()
    (dest / "a.json").write_text("old a")
    (dest / "keep.txt").write_text("keep")

    def half(folder):
        (folder / "a.json").write_text("new a")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space"):
        replace_files(dest, half)
    assert {p.name: p.read_text() for p in dest.iterdir()} == {"a.json": "old a", "keep.txt": "keep"}
    assert [p.name for p in tmp_path.iterdir()] == ["tok"]  # no staging left
    names = replace_files(dest, lambda folder: [(folder / n).write_text(f"new {n}")
                                                for n in ("a.json", "b.json")])
    assert names == ["a.json", "b.json"] and (dest / "b.json").read_text() == "new b.json"
    assert (dest / "keep.txt").read_text() == "keep" and [p.name for p in tmp_path.iterdir()] == ["tok"]


def test_a_full_disk_is_named_by_the_file_or_folder_asked_for(tmp_path):
    from lmforge.io.files import DiskFull
    from lmforge.utils.atomic import replace_dir

    def full(handle):
        raise OSError(28, "No space left on device")  # as a write into a handle says it: no file named

    with pytest.raises(OSError) as err:
        atomic_write(tmp_path / "report.json", full)
    assert str(err.value) == f"[Errno 28] No space left on device: '{tmp_path / 'report.json'}'"

    def model(folder):
        raise DiskFull(folder / "model.safetensors")

    with pytest.raises(DiskFull) as err:
        replace_dir(tmp_path / "model", model)
    assert str(err.value) == f"no space left on device writing {tmp_path / 'model' / 'model.safetensors'}"

    def copy(folder):
        raise OSError(28, "No space left on device", "src/task.json", None, str(folder / "task.json"))

    with pytest.raises(OSError) as err:
        replace_dir(tmp_path / "model", copy)
    assert err.value.filename2 == str(tmp_path / "model" / "task.json") and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("path", [None, 3, b"out", ["out"]])
def test_writable_folder_of_no_name_is_unsafe_path_naming_path(path):
    """A path that is neither text nor os.PathLike failed inside pathlib as a TypeError."""
    with pytest.raises(UnsafePath, match="path must be a folder's name") as caught:
        writable_folder(path, "model directory")
    assert caught.value.field == "path"


def test_file_kind_says_which_kind_a_path_is_following_links(tmp_path):
    """One wording for every refusal of a path that is not a regular file (io, corpus, the CLI)."""
    os.mkfifo(tmp_path / "pipe")
    (tmp_path / "file").write_text("x")
    (tmp_path / "to-pipe").symlink_to(tmp_path / "pipe")
    (tmp_path / "dangling").symlink_to(tmp_path / "gone")
    said = {name: file_kind(tmp_path / name) for name in ("pipe", "file", "to-pipe", "dangling", "missing")}
    assert said == {"pipe": "a named pipe (FIFO)", "file": "a regular file", "to-pipe": "a named pipe (FIFO)",
                    "dangling": "a broken link", "missing": "no such file"}
    assert file_kind(tmp_path) == "a folder" and file_kind("/dev/null") == "a device"


def test_writes_over_sees_an_input_by_any_name_as_the_output_itself(tmp_path):
    """The output is the input: the same path, through ../ or a link (resolved), or a hard link to it."""
    data = tmp_path / "data.txt"
    data.write_text("x")
    os.link(data, tmp_path / "hard.txt")
    os.symlink(tmp_path, tmp_path / "up")
    names = (data, tmp_path / "x" / ".." / "data.txt", tmp_path / "up" / "data.txt", tmp_path / "hard.txt")
    for out in names:
        assert writes_over(data.resolve(), Path(os.path.abspath(out)).resolve()) == "is"
    assert writes_over(data, tmp_path / "other.txt") is None


def test_writes_over_refuses_a_written_name_that_is_holds_or_hard_links_an_input(tmp_path):
    """A folder output holds an input only where a name the job writes is, holds or links to it."""
    out = tmp_path / "out"
    (out / "final").mkdir(parents=True)
    (out / "final" / "train.jsonl").write_text("x")
    (out / "mine.jsonl").write_text("x")
    os.link(out / "mine.jsonl", out / "metrics.jsonl")  # appended to: the input would change
    assert writes_over(out / "final" / "train.jsonl", out, ("final",)) == "holds"
    assert writes_over(out / "final", out, ("final",)) == "holds"
    assert writes_over(out / "mine.jsonl", out, ("metrics.jsonl",)) == "holds"
    assert writes_over(out / "final" / "train.jsonl", out, ("summary.json",)) is None  # held, not written


def test_writes_over_reads_a_model_folder_by_kind_and_any_other_folder_whole(tmp_path):
    """In a model folder (`model`: where its files lie, a job folder's final/) only its model files are read,
    written yet or not, so that a rerun is judged as its first run; in any other folder every file is."""
    job, data = tmp_path / "job", tmp_path / "data"
    (job / "final").mkdir(parents=True)
    (job / "final" / "config.json").write_text("{}")
    data.mkdir()
    for name in ("config.json", "vocab.txt", "model.safetensors"):
        assert writes_over(job, job / "final" / name, model=job / "final") == "lies inside"
    for report in ("preds.jsonl", "view.html", "sub/config.json"):
        assert writes_over(job / "final", job / "final" / report, model=job / "final") is None
        assert writes_over(data, data / report) == "lies inside"
    assert writes_over(job / "final", job / "final" / "out", ("config.json",), model=job / "final") is None
    assert writes_over(data / "missing", data / "missing" / "x.txt") is None  # nothing there to read


def test_one_identity_tells_a_file_named_twice_to_the_corpus_reader_and_to_writes_over(tmp_path):
    """A hard link and a symbolic link are the file they name, a copy is not: the corpus reader's "named
    again" and writes_over's "is" read the one helper (identity), as os.path.samefile would."""
    import warnings

    from lmforge.data.corpus import CorpusWarning, expand_files

    (tmp_path / "a.txt").write_text("text\n")
    os.link(tmp_path / "a.txt", tmp_path / "hard.txt")
    (tmp_path / "soft.txt").symlink_to(tmp_path / "a.txt")
    (tmp_path / "copy.txt").write_text("text\n")
    first = tmp_path / "a.txt"
    for name, same in [("hard.txt", True), ("soft.txt", True), ("copy.txt", False)]:
        other = tmp_path / name
        assert (identity(other) == identity(first)) == same == os.path.samefile(other, first)
        assert (writes_over(first.resolve(), other) == "is") == same
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", CorpusWarning)
            expand_files([first, other])
        assert any("named again" in str(w.message) for w in caught) == same, name
    with pytest.raises(FileNotFoundError):
        identity(tmp_path / "missing")


def test_writes_over_holding_refuses_an_output_folder_that_holds_the_source_at_all(tmp_path):
    """A source model an output may not hold (prune's, quantize's --model): holding it is "holds" though no
    written name meets it; without holding, a held input no name is written over is left alone."""
    model = tmp_path / "runs" / "x" / "final"
    model.mkdir(parents=True)
    for out in (tmp_path / "runs", tmp_path / "runs" / "x"):
        assert writes_over(model, out, ("report.json",), holding=True) == "holds"
        assert writes_over(model, out, ("report.json",)) is None
    assert writes_over(model, model, holding=True) == "is"
    assert writes_over(model, tmp_path / "other", ("final",), holding=True) is None
    assert writes_over(model, model / "q", holding=True) == "lies inside"  # inside is no holding
