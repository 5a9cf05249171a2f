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


def test_a_signed_object_verifies_and_an_edited_or_unsigned_one_is_refused_naming_its_place():
    import pytest

    from lmforge.utils.checksum import sign, verify

    class Refused(ValueError):
        pass

    signed = sign({"arm": "mlm", "shape": (2, 3), "by_id": {1: "a"}}, "sum")
    # as JSON reads it back: tuples as lists, int keys as strings
    assert signed == {"arm": "mlm", "shape": [2, 3], "by_id": {"1": "a"}, "sum": signed["sum"]}
    assert signed["sum"] == json_sha256({k: v for k, v in signed.items() if k != "sum"})  # key: not hashed
    assert sign({**signed, "sum": "stale"}, "sum") == signed  # an old checksum replaced, not hashed
    assert verify(signed, "sum", "f.json:2") is signed
    with pytest.raises(Refused, match=r"^f\.json:2: the row was edited$"):
        verify({**signed, "arm": "electra"}, "sum", "f.json:2", what="the row was edited", error=Refused)
    unsigned = {k: v for k, v in signed.items() if k != "sum"}
    with pytest.raises(ValueError, match=r"^f\.json: does not match its checksum"):
        verify(unsigned, "sum", "f.json")  # a missing checksum is refused ...
    assert verify(unsigned, "sum", "f.json", optional=True) is unsigned  # ... unless the caller tolerates it
    with pytest.raises(ValueError, match=r"^f\.json: does not match its checksum"):
        verify([signed], "sum", "f.json", optional=True)  # not an object: nothing to verify
