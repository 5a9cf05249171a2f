"""bakeoff.plan_corpus: the files a run pretrains on, the plan's own verified against OUT/built.json."""
from __future__ import annotations

import json
import os
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


def test_each_unchanged_file_is_read_once_a_process_and_an_edit_is_still_refused(tmp_path, hash_reads,
                                                                                 settled):
    """The start, each arm's sampling and each arm x seed's pretraining check the files: each re-read every
    file in full. Now one read each while a file's size and times stay; an edit (same size) is refused."""
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("The fox jumps.\n")
    b.write_text("The dog sleeps.\n")
    corpus = {"source": "files", "files": [str(a), str(b)]}
    for _ in range(4):
        assert corpus_files(corpus, tmp_path) == [a, b]
    assert hash_reads == {"a.txt": 1, "b.txt": 1}
    b.write_text("The cat sleeps.\n")
    with pytest.raises(CorpusError, match=re.escape(f"{b}: changed since")):
        corpus_files(corpus, tmp_path)


def test_a_file_changed_just_now_is_read_again_at_each_use(tmp_path, hash_reads):
    """A file written within its clock's tick of a check can change again with the same size and times
    (git's racy files): it is not taken on its stat until it has stood still a while."""
    a = tmp_path / "a.txt"
    a.write_text("The fox jumps.\n")
    for _ in range(2):
        corpus_files({"source": "files", "files": [str(a)]}, tmp_path)
    assert hash_reads == {"a.txt": 2}


def test_a_file_restored_with_its_old_mtime_is_read_again_at_each_use_while_its_ctime_is_recent(
        tmp_path, hash_reads):
    """A restore (cp -p, rsync -t) sets a file's mtime back an hour, but the file changed just now: the
    racy guard read the mtime, so a second change within the same tick, times kept, was taken on its stat."""
    a = tmp_path / "a.txt"
    a.write_text("The fox jumps.\n")
    then = os.stat(a).st_mtime_ns - 3600 * 10 ** 9
    os.utime(a, ns=(then, then))
    for _ in range(2):
        corpus_files({"source": "files", "files": [str(a)]}, tmp_path)
    assert hash_reads == {"a.txt": 2}


def test_a_built_corpus_without_a_record_is_recorded_at_its_next_use_then_held_to_it(tmp_path):
    """A built corpus that OUT/built.json did not record (an OUT from before the record, or the record
    removed) was never checked again: it is recorded at its next use, as the plan's own files are."""
    corpus = {"source": "builtin", "documents": 20}
    built, = corpus_files(corpus, tmp_path)
    (tmp_path / BUILT).unlink()
    corpus_files(corpus, tmp_path)
    assert list(read_signed(tmp_path / BUILT)) == [built.relative_to(tmp_path).as_posix()]
    built.write_text(built.read_text().replace("the", "a"))
    with pytest.raises(ValueError, match=re.escape(f"{built}: changed or damaged since the plan built it")):
        corpus_files(corpus, tmp_path)
