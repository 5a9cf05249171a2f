import gzip
import json
import tracemalloc
import warnings

import pytest

from lmforge.data.corpus import CHUNK, CorpusReader, CorpusWarning, ReadOptions, expand_files, read_range
from lmforge.data.synthetic import documents, write_corpus
from lmforge.train.pretrain import read_documents


def _read(*files, **kw):
    return list(CorpusReader(list(files), **kw))


def test_plain_text_by_block_by_file_and_wrapped_lines(tmp_path):
    f = tmp_path / "a.txt"
    f.write_text("Dr. Who came. He left!\nA second line\n\n  \nNext doc.\n", encoding="utf-8")
    assert _read(f) == [["Dr. Who came.", "He left!", "A second line"], ["Next doc."]]
    assert _read(f, document="file") == [["Dr. Who came.", "He left!", "A second line", "Next doc."]]
    (tmp_path / "w.txt").write_text("It was a long\nday. Mr. Li went\nhome.\n\nNew block.")
    assert _read(tmp_path / "w.txt", join_lines=True) == [["It was a long day.", "Mr. Li went home."],
                                                           ["New block."]]


def test_the_builtin_corpus_reads_back_document_for_document(tmp_path):
    write_corpus(tmp_path / "c.txt", 200_000, seed=3)
    docs = _read(tmp_path / "c.txt")
    assert docs == list(documents(len(docs), seed=3))


def test_jsonl_gzip_and_directories(tmp_path):
    records = [{"text": "First doc. Two sentences.", "id": 1}, {"body": "Other field."},
               {"text": "Line one\nLine two"}]
    lines = "\n".join(json.dumps(r) for r in records) + "\n"
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.jsonl").write_text(lines)
    with gzip.open(tmp_path / "d" / "b.jsonl.gz", "wt") as handle:
        handle.write(lines)
    with gzip.open(tmp_path / "d" / "c.txt.gz", "wt") as handle:
        handle.write("Gzipped text.\n\nAnd more.\n")
    want = [["First doc.", "Two sentences."], ["Line one", "Line two"]]
    with pytest.warns(CorpusWarning, match="without a string text field"):
        assert _read(tmp_path / "d" / "a.jsonl") == want
    with pytest.warns(CorpusWarning):
        got = _read(tmp_path / "d")  # a directory: its files, sorted
    assert got == want + want + [["Gzipped text."], ["And more."]]
    assert _read(tmp_path / "d" / "a.jsonl", text_field="body") == [["Other field."]]


def test_empty_files_and_bad_json_warn(tmp_path):
    (tmp_path / "empty.txt").write_bytes(b"")
    (tmp_path / "blank.txt").write_text("\n \n\t\n")
    (tmp_path / "bad.jsonl").write_text('{"text": "Fine."}\nnot json\n[1, 2]\n{"text": 3}\n')
    with pytest.warns(CorpusWarning) as seen:
        assert _read(tmp_path / "empty.txt", tmp_path / "blank.txt") == []
    assert [str(w.message).split("/")[-1] for w in seen] == ["empty.txt is empty", "blank.txt holds no text"]
    with pytest.warns(CorpusWarning, match=r"skipped 1 line\(s\) that are not JSON and 2 without"):
        assert _read(tmp_path / "bad.jsonl") == [["Fine."]]
    with pytest.raises(FileNotFoundError, match="missing.txt"):
        CorpusReader([tmp_path / "missing.txt"])


def test_non_utf8_bytes_skip_replace_or_strict_with_the_byte_offset(tmp_path):
    f = tmp_path / "latin1.txt"
    f.write_bytes(b"Good line.\nCaf\xe9 au lait.\nAlso good.\n")
    with pytest.warns(CorpusWarning,
                      match=r"1 piece\(s\) of lines not UTF-8, skipped \(first bad byte at offset 14"):
        assert _read(f) == [["Good line.", "Also good."]]
    with pytest.warns(CorpusWarning, match="kept with U\\+FFFD"):
        assert _read(f, errors="replace") == [["Good line.", "Caf\ufffd au lait.", "Also good."]]
    with pytest.raises(ValueError, match="not UTF-8 text \\(byte offset 14\\)"):
        _read(f, errors="strict")
    with pytest.raises(ValueError, match="errors='ignore'"):
        ReadOptions(errors="ignore")


def test_control_characters_are_stripped(tmp_path):
    f = tmp_path / "ctl.txt"
    f.write_bytes("\ufeffNUL\x00 and\tbell\x07 here.\r\nESC\x1b[0m ok.\x85\n".encode())
    with pytest.warns(CorpusWarning, match="control character"):
        assert _read(f) == [["NUL and bell here.", "ESC[0m ok."]]


@pytest.mark.parametrize("end", ["\r\n", "\r"])
def test_crlf_and_lone_cr_end_lines_and_blank_lines_end_documents_as_lf_does(tmp_path, end):
    # with CRLF the first read ends between a CR and its LF: still one line end, not a blank line
    text = "One. Two.\nThree\n\nNext doc.\n\n" + "x" * (CHUNK - 34) + "\nMore.\n\nLast doc.\n"
    (tmp_path / "lf.txt").write_text(text, newline="")
    (tmp_path / "other.txt").write_text(text.replace("\n", end), newline="")
    (tmp_path / "r.jsonl").write_text('{"text": "A."}' + end + '{"text": "B."}' + end, newline="")
    want = _read(tmp_path / "lf.txt")
    assert len(want) == 4 and _read(tmp_path / "other.txt") == want
    assert _read(tmp_path / "r.jsonl") == [["A."], ["B."]]


def test_a_jsonl_record_longer_than_max_document_chars_is_cut_in_parts_as_a_text_line_is(tmp_path):
    text = "Word is here. " * 250_000  # 3.5 MB in one record: one document of 3.5 MB before
    (tmp_path / "a.txt").write_text(text + "\n")
    (tmp_path / "a.jsonl").write_text(json.dumps({"text": text}) + "\n" + json.dumps({"text": "B."}) + "\n")
    with pytest.warns(CorpusWarning, match="cut 1 over-long document"):  # in 2 parts
        docs = _read(tmp_path / "a.jsonl", max_document_chars=1 << 20)
    assert len(docs) == 2 + 1 and max(sum(map(len, d)) for d in docs) < 3 << 20 and docs[-1] == ["B."]
    with pytest.warns(CorpusWarning, match="cut 1 over-long document"):
        assert _read(tmp_path / "a.txt", max_document_chars=1 << 20) == docs[:-1]


def test_a_10mb_single_line_is_read_in_pieces_with_flat_memory(tmp_path):
    f = tmp_path / "long.txt"
    sentence = "The quick brown fox jumps over the lazy dog \u00e9 " * 10 + "end. "  # a 2-byte character
    with open(f, "w", encoding="utf-8") as handle:
        handle.write(sentence * (10_000_000 // len(sentence)) + "X" * 300_000 + "\nLast line.\n")
    tracemalloc.start()
    n_sentences, longest, docs = 0, 0, 0
    with pytest.warns(CorpusWarning, match="cut 1 over-long document\\(s\\) and 2 over-long sentence"):
        for doc in CorpusReader([f], max_document_chars=1 << 18):
            docs += 1
            n_sentences += len(doc)
            longest = max(longest, max(map(len, doc)))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert n_sentences == 10_000_000 // len(sentence) + 3 + 1 and longest == 100_000
    assert docs >= 10 and peak < 6 * CHUNK  # pieces and one document part, never the 10 MB line


@pytest.mark.parametrize("compress, name, said", [
    ("gzip", "cut.txt.gz", "damaged gzip"),
    ("lzma", "cut.txt.xz", "damaged xz data .*; kept the text before it")])
def test_a_truncated_compressed_file_keeps_what_it_can(tmp_path, compress, name, said):
    data = __import__(compress).compress(("Sentence number one.\n\n" * 20_000).encode())
    (tmp_path / name).write_bytes(data[: len(data) // 2])
    with pytest.warns(CorpusWarning, match=said):
        docs = _read(tmp_path / name)
    assert 0 < len(docs) < 20_000 and docs[0] == ["Sentence number one."]


def test_truncated_gzip_keeps_its_last_document_too(tmp_path):
    """A file of one document (no blank line) cut short keeps the text before the damage, as said."""
    lines = [f"Sentence number {i}." for i in range(40_000)]
    data = gzip.compress("\n".join(lines).encode())
    (tmp_path / "cut.txt.gz").write_bytes(data[: len(data) // 2])
    for document in ("block", "file"):
        with pytest.warns(CorpusWarning, match="damaged gzip data .*; kept the text before it"):
            (doc,) = _read(tmp_path / "cut.txt.gz", document=document)
        assert 1000 < len(doc) < len(lines) and doc[:-1] == lines[:len(doc) - 1]  # the last line may be cut


def test_byte_ranges_read_as_the_whole(tmp_path):
    f = tmp_path / "c.txt"
    write_corpus(f, 50_000, seed=1)
    text = f.read_bytes()
    cut = text.index(b"\n\n", 20_000) + 2  # a document start
    parts = list(read_range(f, ReadOptions(), 0, cut)) + list(read_range(f, ReadOptions(), cut, None))
    assert parts == _read(f)


def test_read_documents_keeps_its_contract(tmp_path):
    (tmp_path / "bad.txt").write_bytes(b"\x80\x81 text")  # not UTF-8 (and no byte-order mark)
    with pytest.warns(CorpusWarning), pytest.raises(ValueError, match="no text in .*not UTF-8"):
        read_documents([tmp_path / "bad.txt"])
    (tmp_path / "a.jsonl").write_text('{"text": "Mr. X left. Then Y."}\n')
    assert read_documents([tmp_path / "a.jsonl"]) == [["Mr. X left.", "Then Y."]]


def test_a_utf16_file_is_refused_naming_it(tmp_path):
    from lmforge.train.pretrain import read_documents

    wide = tmp_path / "wide.txt"
    wide.write_bytes("the cat sat on the mat.\n".encode("utf-16"))  # with its byte-order mark
    with pytest.raises(ValueError, match=r"wide\.txt: UTF-16LE text; lmforge reads UTF-8"):
        read_documents([wide])


@pytest.mark.parametrize("encoding,said", [("utf-32", "UTF-32LE text"), ("utf-32-be", "NUL bytes"),
                                           ("utf-16-le", "NUL bytes"), ("utf-16-be", "NUL bytes")])
def test_utf32_and_wide_text_without_a_byte_order_mark_are_refused_not_read_as_nul_stripped_bytes(
        tmp_path, encoding, said):
    """UTF-32 was named UTF-16 (its mark starts so); BOM-less UTF-16 read as text with NULs stripped."""
    wide = tmp_path / "w.txt"
    wide.write_bytes("Caf\u00e9 is good. Two.\n\nNext.\n".encode(encoding))
    with pytest.raises(ValueError, match=f"w\\.txt: .*{said}.*lmforge reads UTF-8"):
        _read(wide)
    wide.write_bytes(b"One NUL\x00 in text.\n" * 100)  # a few NULs: text, the NULs stripped (said)
    with pytest.warns(CorpusWarning, match="100 control character"):
        assert _read(wide) == [["One NUL in text."] * 100]


def test_a_folder_walk_leaves_out_shard_folders_only(tmp_path):
    (tmp_path / "sh").mkdir()
    (tmp_path / "sh" / "manifest.json").write_text(json.dumps({"format": "lmforge-shards", "version": 1}))
    (tmp_path / "sh" / "shard-00000.bin").write_bytes(b"\x01\x00\x02\x00")
    (tmp_path / "own").mkdir()
    (tmp_path / "own" / "manifest.json").write_text(json.dumps({"text": "A user's own file."}) + "\n")
    (tmp_path / "a.txt").write_text("Text.\n")
    with pytest.warns(CorpusWarning, match="sh: skipped"):
        found = expand_files([tmp_path])
    assert found == [tmp_path / "a.txt", tmp_path / "own" / "manifest.json"]


def test_a_folder_walk_leaves_out_hidden_folders_and_what_a_killed_write_left(tmp_path):
    (tmp_path / "a.txt").write_text("Text.\n")
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (tmp_path / ".tok.new-4242-x").mkdir()  # the fresh folder of a replace_dir killed mid-write (SIGKILL)
    (tmp_path / ".tok.new-4242-x" / "tokenizer.json").write_text("{}")
    with pytest.warns(CorpusWarning, match=": left out 2 hidden$"):
        assert expand_files([tmp_path]) == [tmp_path / "a.txt"]


def test_a_folder_walk_says_what_it_leaves_out_pipes_broken_links_and_linked_folders(tmp_path):
    import os

    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.txt").write_text("Text.\n")
    (tmp_path / "a.txt").symlink_to(tmp_path / "sub" / "b.txt")  # a linked file is read (again: said)
    (tmp_path / "loop").symlink_to(tmp_path, target_is_directory=True)
    (tmp_path / "gone.txt").symlink_to(tmp_path / "missing.txt")
    os.mkfifo(tmp_path / "sub" / "pipe")  # reading it would wait forever
    with pytest.warns(CorpusWarning) as caught:
        assert expand_files([tmp_path]) == [tmp_path / "a.txt", tmp_path / "sub" / "b.txt"]
    assert [str(w.message) for w in caught] == [f"{tmp_path}: left out 1 linked folder(s) (not followed); "
                                                "2 pipe(s), socket(s), device(s) or broken link(s)",
                                                f"{tmp_path / 'sub' / 'b.txt'}: the same file as "
                                                f"{tmp_path / 'a.txt'}, named again: its documents are "
                                                "read again"]


def test_a_pipe_or_a_device_is_named_as_no_regular_file_not_as_missing(tmp_path):
    """`corpus shard /dev/zero` said "no such file: /dev/zero"."""
    import os

    os.mkfifo(tmp_path / "pipe")
    for path, kind in ((tmp_path / "pipe", r"a named pipe \(FIFO\)"), ("/dev/zero", "a device")):
        with pytest.raises(ValueError, match=f"^{path} is not a regular file or a folder [(]{kind}[)]$"):
            expand_files([path])
    with pytest.raises(FileNotFoundError, match="no such file"):
        expand_files([tmp_path / "missing.txt"])


@pytest.mark.parametrize("suffix, compress", [(".bz2", "bz2"), (".xz", "lzma"), ("", "bz2")])
def test_bzip2_and_xz_files_read_as_their_text(tmp_path, suffix, compress):
    """bzip2 and xz (told by their magic bytes, whatever the name) are decompressed as gzip is: read as
    text, their bytes were junk documents, some kept (or all, as U+FFFD, under errors="replace")."""
    module = __import__(compress)
    text = "First sentence here.\nSecond one.\n\nAnother document.\n" * 50
    (tmp_path / f"c.txt{suffix}").write_bytes(module.compress(text.encode()))
    (tmp_path / "c.plain").write_text(text, encoding="utf-8")
    for errors in ("skip", "replace"):
        assert _read(tmp_path / f"c.txt{suffix}", errors=errors) == _read(tmp_path / "c.plain")


def test_text_opening_with_bzh_is_text_and_a_plain_file_s_read_error_is_raised(tmp_path, monkeypatch):
    """bzip2 was told by "BZh" alone (a text file "BZh is ..." read as empty, with a damage warning), and any
    OSError reading a plain file was taken for a damaged stream (its text cut, with a warning)."""
    import bz2

    (tmp_path / "t.txt").write_text("BZh is a word here.\n\nAnd a second document.\n", encoding="utf-8")
    assert _read(tmp_path / "t.txt") == [["BZh is a word here."], ["And a second document."]]
    (tmp_path / "e.txt.bz2").write_bytes(bz2.compress(b""))  # an empty stream: its end-of-stream magic
    with pytest.warns(CorpusWarning):  # nothing in it
        assert _read(tmp_path / "e.txt.bz2") == []
    import lmforge.data.openers as openers

    class Failing:
        def __init__(self, *a):
            pass

        def read1(self, n):
            raise OSError(5, "Input/output error")

    with pytest.raises(OSError, match="Input/output error"):
        openers.read_some(Failing(), 10)


def test_a_file_named_again_is_read_again_and_said(tmp_path):
    """Overlapping globs (a folder and a file in it, a name twice, a link to it) weighed its documents
    twice, unsaid; naming a file twice is also the one way to weigh it up: kept, and said."""
    folder = tmp_path / "c"
    folder.mkdir()
    (folder / "a.txt").write_text("one sentence here.\n\nanother document.\n")
    (tmp_path / "link.txt").symlink_to(folder / "a.txt")
    named = [folder, folder / "a.txt", tmp_path / "link.txt", folder / "a.txt"]
    with pytest.warns(CorpusWarning, match="named again: its documents are read again") as caught:
        files = expand_files(named)
    assert files == [folder / "a.txt", folder / "a.txt", tmp_path / "link.txt", folder / "a.txt"]
    assert len(caught) == 3
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(list(CorpusReader([folder]))) == 2  # a file named once: no warning
