"""json_object: the one lenient reading of a JSON file (a config that informs a choice), None for every
way the file is not a JSON object."""
import pytest

from lmforge.utils.jsonfile import json_object


@pytest.mark.parametrize("content", [None, b"", b"{not json", b"[1, 2]", b'"text"', b"null", b"\xff\xfe{}",
                                     b"[" * 100_000, b'{"n": 1' + b"1" * 5000 + b"}"])
def test_anything_but_a_json_object_is_none(tmp_path, content):
    """No file, not JSON, not UTF-8, JSON of another kind, nesting too deep (json.loads: a RecursionError) and
    an integer of 5000 digits (a plain ValueError): each is None, never an exception."""
    path = tmp_path / "config.json"
    if content is not None:
        path.write_bytes(content)
    assert json_object(path) is None


def test_a_folder_in_its_place_is_none_and_an_object_is_itself(tmp_path):
    (tmp_path / "config.json").mkdir()
    assert json_object(tmp_path / "config.json") is None
    (tmp_path / "b.json").write_text('{"format": "lmforge", "n": [1, 2], "é": {}}', encoding="utf-8")
    assert json_object(str(tmp_path / "b.json")) == {"format": "lmforge", "n": [1, 2], "é": {}}
    (tmp_path / "e.json").write_text("{}", encoding="utf-8")
    assert json_object(tmp_path / "e.json") == {}
