"""Files carried into OUT/model get the mode a new file has under the umask, not the source's."""
import os
import stat

import pytest

from lmforge.compress.model_files import carry_sentence_files
from lmforge.utils.atomic import replace_dir


def _mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize("mask", [0o077, 0o022])
def test_carried_files_and_the_folder_get_the_umask_mode_not_the_source_mode(tmp_path, mask):
    source = tmp_path / "st"
    (source / "1_Pooling").mkdir(parents=True)
    for path in (source / "modules.json", source / "1_Pooling" / "config.json"):
        path.write_text("{}")
        os.chmod(path, 0o600 if mask == 0o022 else 0o644)  # the source's mode is not the copy's
    before = os.umask(mask)
    try:
        replace_dir(tmp_path / "model", lambda d: carry_sentence_files(source, d))
    finally:
        os.umask(before)
    dest = tmp_path / "model"
    assert _mode(dest) == _mode(dest / "1_Pooling") == 0o777 & ~mask
    assert _mode(dest / "modules.json") == _mode(dest / "1_Pooling" / "config.json") == 0o666 & ~mask


def test_an_output_folder_that_is_or_holds_the_source_or_is_no_folder_is_refused_naming_out(tmp_path):
    """run_prune(model_dir="p/model", out="p") replaced the model it read and reported it as its own
    "before"; an out of "" wrote into the working folder, None was a TypeError, a file an OSError after
    the work."""
    from lmforge.compress.model_files import output_folder
    from lmforge.utils.atomic import UnsafePath

    source = tmp_path / "p" / "model"
    source.mkdir(parents=True)
    afile = tmp_path / "afile"
    afile.write_text("x")
    for out, words in ((source, f"^out {source} is the input model {source}: "),
                       (tmp_path / "p", f"^out {tmp_path / 'p'} holds the input model {source}: "),
                       ("", "is empty"), (" ", "is empty"), (None, "must be a folder path"),
                       (afile, "not a folder"), (afile / "sub", "is a file")):
        with pytest.raises(UnsafePath, match=words) as err:
            output_folder(out, source)
        assert err.value.field == "out" and "\n" not in str(err.value)
    assert output_folder(tmp_path / "q", source) == tmp_path / "q"
    assert output_folder(source / "sub", source) == source / "sub"  # as --out: beside the model's files


def test_an_output_folder_whose_written_model_is_the_source_by_a_link_is_refused(tmp_path):
    """utils.atomic.writes_over's rule: OUT/model, a link to the source folder, is the source by another
    name; a written name elsewhere, or a link to another folder, is not."""
    from lmforge.compress.model_files import output_folder
    from lmforge.utils.atomic import UnsafePath

    source, out = tmp_path / "m", tmp_path / "out"
    source.mkdir()
    (tmp_path / "other").mkdir()
    out.mkdir()
    (out / "model").symlink_to(source, target_is_directory=True)
    with pytest.raises(UnsafePath, match=f"^out {out} holds the input model {source}: ") as err:
        output_folder(out, source, ("model", "prune.json"))
    assert err.value.field == "out"
    assert output_folder(out, tmp_path / "other", ("model",)) == out
