"""run_heads, the Python face of `lmforge heads`: an output folder that is a symbolic link is refused (as
the command line refuses it) before the model is read, and nothing is written where it points."""
import pytest

from lmforge.analysis.head_report import run_heads
from lmforge.utils.atomic import UnsafePath


def test_a_link_as_the_output_folder_is_refused_before_any_work(tmp_path):
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "out").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    with pytest.raises(UnsafePath, match="out: is a symbolic link"):
        run_heads(tmp_path / "no-model", [], tmp_path / "out")
    assert list((tmp_path / "elsewhere").iterdir()) == []
