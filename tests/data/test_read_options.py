"""data/read_options: ReadOptions is bounded and refuses a setting its format never reads, in Python and on
`lmforge corpus shard` alike; shard_corpus bounds its workers and shard size as the flags do."""
from pathlib import Path

import pytest

from lmforge.config.options import OptionsError
from lmforge.data.read_options import MAX_CHARS, ReadOptions
from tests.faces import cli_verdict


@pytest.mark.parametrize("given, field", [
    ({"max_document_chars": 0}, "max_document_chars"), ({"max_document_chars": 2.5}, "max_document_chars"),
    ({"max_sentence_chars": MAX_CHARS + 1}, "max_sentence_chars"), ({"errors": "ignore"}, "errors"),
    ({"format": "csv"}, "format"), ({"text_field": ""}, "text_field"), ({"join_lines": "yes"}, "join_lines"),
    ({"format": "text", "text_field": "body"}, "text_field"),
    ({"format": "jsonl", "document": "file"}, "document"),
    ({"format": "jsonl", "join_lines": True}, "join_lines")])
def test_bad_or_unread_settings_are_refused_naming_the_field(given, field):
    with pytest.raises(OptionsError) as refused:
        ReadOptions(**given)
    assert refused.value.field == field and "\n" not in str(refused.value)


def test_settings_of_either_format_pass_where_the_format_is_told_by_the_file_name():
    auto = ReadOptions(text_field="body", document="file", join_lines=True)  # a mix: each file reads its own
    assert auto.format_of(Path("a.jsonl.gz")) == "jsonl" and auto.format_of(Path("a.txt")) == "text"
    ReadOptions(format="text", document="file", join_lines=True)
    ReadOptions(format="jsonl", text_field="body")


@pytest.mark.parametrize("given, field", [({"workers": 2.5}, "workers"), ({"workers": 257}, "workers"),
                                          ({"workers": True}, "workers"),
                                          ({"shard_bytes": 1}, "shard_bytes")])
def test_shard_corpus_bounds_its_workers_and_shard_size_as_the_flags_do(tmp_path, given, field):
    from lmforge.data.shards import shard_corpus

    with pytest.raises(OptionsError) as refused:
        shard_corpus([tmp_path / "none.txt"], tmp_path / "tok", tmp_path / "out", **given)
    assert refused.value.field == field and not (tmp_path / "out").exists()


def test_the_command_line_refuses_what_python_refuses_naming_the_flag(tmp_path):
    (tmp_path / "a.txt").write_text("One sentence.\n")
    for flags, flag in ((["--format", "text", "--text-field", "body"], "--text-field"),
                        (["--format", "jsonl", "--join-lines"], "--join-lines"),
                        (["--max-sentence-chars", "0"], "--max-sentence-chars")):
        argv = ["corpus", "shard", str(tmp_path / "a.txt"), "--tokenizer", str(tmp_path / "tok"), "--out",
                str(tmp_path / "o"), *flags]
        err = cli_verdict(argv, {})  # exit status 2, one line on standard error, nothing on standard output
        assert err is not None and flag in err, err
        assert not (tmp_path / "o").exists()
