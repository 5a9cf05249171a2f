"""`lmforge embed --calibrate` writes the ranges beside the model and no embeddings: an --out with it is
refused in one line (exit 2) before the model is read, never taken and left unwritten."""
from tests.faces import cli_verdict


def test_calibrate_refuses_an_out_it_would_not_write(tmp_path):
    line = cli_verdict(["embed", "--model", str(tmp_path / "no-model"), "--calibrate", "a text"],
                       {"out": tmp_path / "e.npy"})
    assert line is not None and "--out" in line and "--calibrate writes no embeddings" in line, line
    assert list(tmp_path.iterdir()) == []
