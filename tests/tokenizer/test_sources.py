"""The training input of a tokenizer read as `corpus shard` reads it: compressed files told by their
magic bytes whatever their names, and no empty name read as the working folder."""
import bz2
import gzip
import lzma

import pytest

from lmforge.cli import main
from lmforge.tokenizer import TokenizerError, train_tokenizer

TEXT = "the cat sat on the mat\nthe dog ate the log\n" * 20
PACKERS = {"gzip.txt": gzip.compress, "text.bz2": bz2.compress, "text.xz": lzma.compress,
           "any.name": gzip.compress}


def test_compressed_files_train_as_their_text_whatever_their_name(tmp_path):
    """A bzip2 or xz file, or gzip without .gz, was given to the Rust reader as text: refused as not UTF-8,
    while `corpus shard` reads each (by its magic bytes)."""
    plain = tmp_path / "plain.txt"
    plain.write_text(TEXT, encoding="utf-8")
    want = train_tokenizer(plain, "bytelevel-bpe", 280).backend.to_str()
    for name, pack in PACKERS.items():
        (tmp_path / name).write_bytes(pack(TEXT.encode()))
        assert train_tokenizer(tmp_path / name, "bytelevel-bpe", 280).backend.to_str() == want, name
    argv = ["tokenizer", "train", str(tmp_path / "text.xz"), "--kind", "bpe", "--vocab-size", "60"]
    assert main([*argv, "--out", str(tmp_path / "out")]) == 0


def test_each_file_is_probed_once_by_its_magic_bytes_with_no_decompressor(tmp_path, monkeypatch):
    """The training input tells a file's compression once (data/openers.compression), not once to check the
    corpus and again to route it, and by its first bytes alone: no gzip, bzip2 or xz reader is opened."""
    import lmforge.data.openers as openers
    from lmforge.tokenizer.sources import Corpus

    plain = tmp_path / "plain.txt"
    plain.write_text(TEXT, encoding="utf-8")
    for name, pack in PACKERS.items():
        (tmp_path / name).write_bytes(pack(TEXT.encode()))
    probed, real = [], openers._probe

    def probe(path):
        probed.append(path.name)
        return real(path)

    def unopened(*args, **kwargs):
        raise AssertionError("a decompressor was opened to tell a file's kind")

    monkeypatch.setattr(openers, "_probe", probe)
    monkeypatch.setattr(openers, "COMPRESSED", {magic: (unopened, name)
                                                for magic, (_, name) in openers.COMPRESSED.items()})
    for files, routed in [([plain], False), ([plain, tmp_path / "text.xz"], True),
                          ([plain, tmp_path / "any.name"], True)]:
        probed.clear()
        corpus = Corpus(files)
        assert sorted(probed) == sorted(f.name for f in files) and (corpus.reader is not None) == routed


def test_a_wide_text_file_is_a_tokenizer_error_naming_it(tmp_path):
    (tmp_path / "wide.txt").write_bytes(TEXT.encode("utf-16"))
    with pytest.raises(TokenizerError, match="wide.txt: UTF-16"):
        train_tokenizer(tmp_path / "wide.txt", "bpe", 60)


def test_an_empty_file_name_is_refused_never_read_as_the_working_folder(tmp_path, monkeypatch):
    """train_tokenizer("") trained on every file of the working folder (Path("") is ".")."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a.txt").write_text(TEXT, encoding="utf-8")
    for empty in ("", "  "):
        with pytest.raises(TokenizerError, match="file name is empty"):
            train_tokenizer(empty, "bpe", 60)
    with pytest.raises(TokenizerError, match="empty corpus"):  # in a list, "" is a text: blank, none
        train_tokenizer(["", " "], "bpe", 60)


def test_read_options_read_the_files_as_corpus_shard_does_alike_from_the_command_line_and_python(tmp_path):
    """A JSONL corpus whose text is under "body" (`corpus shard --text-field body`) trains its tokenizer
    on that field from both faces (only "text" was read: a tokenizer of the wrong field)."""
    import json
    from pathlib import Path

    from lmforge.config.options import OptionsError
    from lmforge.data.read_options import ReadOptions
    from lmforge.tokenizer import load_tokenizer

    data = tmp_path / "c.jsonl"
    records = ({"body": f"alpha beta gamma {i}", "text": "zzz"} for i in range(50))
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    python = train_tokenizer(Path(data), "wordpiece", 60, read=ReadOptions(text_field="body"))
    assert main(["tokenizer", "train", str(data), "--kind", "wordpiece", "--vocab-size", "60", "--out",
                 str(tmp_path / "t"), "--text-field", "body"]) == 0
    command = load_tokenizer(tmp_path / "t")
    assert python.backend.get_vocab() == command.backend.get_vocab()
    assert "gamma" in python.backend.get_vocab() and "zzz" not in python.backend.get_vocab()
    with pytest.raises(OptionsError, match="read: options say how files are read"):
        train_tokenizer(["alpha beta"], "wordpiece", 60, read=ReadOptions(text_field="body"))
    assert main(["tokenizer", "train", "--kind", "bpe", "--vocab-size", "300", "--out", str(tmp_path / "b"),
                 "--text-field", "body"]) == 2  # the built-in corpus is read as it is


@pytest.mark.parametrize("kind", ["wordpiece", "bpe", "bytelevel-bpe", "unigram"])
def test_a_text_with_a_lone_surrogate_is_refused_naming_its_index(kind):
    from lmforge.config.options import OptionsError

    texts = ["the cat sat on the mat"] * 3 + ["the \ud800 cat"]  # was "'utf-8' codec can't encode", no text
    with pytest.raises(OptionsError, match=r"^source\[3\] is not valid Unicode: surrogates not") as err:
        train_tokenizer(texts, kind, 300)
    assert err.value.field == "source"
