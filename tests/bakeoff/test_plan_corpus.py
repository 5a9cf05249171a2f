"""bakeoff.plan_corpus: the files a run pretrains on, the plan's own verified against OUT/built.json."""
from __future__ import annotations

import json
import re

import pytest

from lmforge.bakeoff.plan_corpus import CorpusError, corpus_files
from lmforge.bakeoff.results import BUILT, read_signed


def test_a_plans_files_and_a_built_corpus_keep_their_checksums_in_one_built_json(tmp_path):
    """The plan's files (an arm's corpus) and a built corpus (the plan's) share OUT/built.json: writing one's
    record kept the other's, so each is verified on the next run."""
    text = tmp_path / "c.txt"
    text.write_text("The fox jumps over the dog.\n")
    out = tmp_path / "o"
    out.mkdir()
    built, = corpus_files({"source": "builtin", "documents": 20}, out)
    assert corpus_files({"source": "files", "files": [str(text)]}, out) == [text]
    record = read_signed(out / BUILT)
    assert set(record) == {built.relative_to(out).as_posix(), "sources"}
    assert list(record["sources"]) == [str(text)]
    built.write_text(built.read_text().replace("the", "a"))
    with pytest.raises(ValueError, match=re.escape(str(built))):
        corpus_files({"source": "builtin", "documents": 20}, out)


def test_a_folder_named_as_a_corpus_file_is_refused_naming_it(tmp_path):
    """A folder has no one checksum: a one-line CorpusError naming it, nothing recorded."""
    with pytest.raises(CorpusError, match=re.escape(f"{tmp_path}: not a file")):
        corpus_files({"source": "files", "files": [str(tmp_path)]}, tmp_path)
    assert not (tmp_path / BUILT).exists()


def test_a_file_first_read_by_a_later_run_is_recorded_then_held_to_it(tmp_path):
    """An arm's corpus file read first by a rerun (an arm added to the plan) is recorded then, not refused."""
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("One.\n")
    b.write_text("Two.\n")
    corpus_files({"source": "files", "files": [str(a)]}, tmp_path)
    corpus_files({"source": "files", "files": [str(a), str(b)]}, tmp_path)
    assert sorted(json.loads((tmp_path / BUILT).read_text())["sources"]) == [str(a), str(b)]
    b.write_text("Three.\n")
    with pytest.raises(CorpusError, match=re.escape(f"{b}: changed since")):
        corpus_files({"source": "files", "files": [str(b)]}, tmp_path)
