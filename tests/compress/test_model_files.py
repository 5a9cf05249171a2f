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
