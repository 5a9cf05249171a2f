"""The checksums verified artefacts record: of a file, and of a JSON object holding its own."""
import hashlib

from lmforge.utils.checksum import json_sha256, sha256


def test_a_file_s_checksum_is_sha256_of_its_bytes_read_in_blocks(tmp_path):
    data = bytes(range(256)) * 10_000  # over two blocks
    (tmp_path / "f").write_bytes(data)
    assert sha256(tmp_path / "f") == hashlib.sha256(data).hexdigest()


def test_a_json_object_s_checksum_leaves_its_own_field_out_and_tells_a_change():
    row = {"arm": "mlm", "value": 0.5, "metrics": {"b": 1, "a": 2}}
    signed = {**row, "checksum": json_sha256(row, "checksum")}
    assert json_sha256(signed, "checksum") == signed["checksum"]  # the field it is kept in is not read
    assert json_sha256(dict(reversed(list(row.items())))) == json_sha256(row)  # key order: one form
    assert json_sha256({**row, "value": 0.99}, "checksum") != signed["checksum"]


def test_files_are_checked_against_their_recorded_sums_naming_the_first_wrong_one(tmp_path):
    import pytest

    from lmforge.utils.checksum import check_files

    (tmp_path / "a").write_text("a")
    (tmp_path / "b").write_text("b")
    sums = {"a": sha256(tmp_path / "a"), "b": sha256(tmp_path / "b")}
    check_files(tmp_path, sums, tmp_path / "manifest.json")  # whole: no word
    (tmp_path / "b").write_text("B")
    with pytest.raises(ValueError, match=r"/b: checksum does not match the manifest"):
        check_files(tmp_path, sums, tmp_path / "manifest.json")
    with pytest.raises(ValueError, match=r"/c: missing \(listed in .*manifest.json\)"):
        check_files(tmp_path, {"c": "0"}, tmp_path / "manifest.json")
