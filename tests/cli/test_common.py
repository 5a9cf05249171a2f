"""cli/common.check_out: an output folder that would write over its source is refused."""
import pytest

from lmforge.cli.common import UsageError, check_out


def test_check_out_refuses_empty_files_and_sources(tmp_path):
    source = tmp_path / "run" / "model"
    source.mkdir(parents=True)
    (tmp_path / "afile").write_text("x")
    for out, message in [("", "--out is empty"), ("  ", "--out is empty"),
                         (str(tmp_path / "afile"), "exists and is not a folder"),
                         (str(source), "is or holds the source model"),
                         (str(tmp_path / "run"), "is or holds the source model"),
                         (str(tmp_path), "is or holds the source model")]:
        with pytest.raises(UsageError, match=message):
            check_out(out, str(source))


def test_check_out_accepts_new_folders_beside_or_inside_the_source(tmp_path):
    source = tmp_path / "run" / "model"
    source.mkdir(parents=True)
    for out in (tmp_path / "other", tmp_path / "run" / "model" / "q", tmp_path / "run2"):
        assert check_out(str(out), str(source), "all-MiniLM-L6-v2", None) == out
    with pytest.raises(UsageError, match="--teacher-out"):
        check_out("", option="--teacher-out")
