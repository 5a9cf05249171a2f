import json

import numpy as np
import pytest
from tokenizers import Tokenizer as Backend
from tokenizers import pre_tokenizers
from tokenizers.models import WordLevel

import lmforge.data.shards as shards
from lmforge.cli import main
from lmforge.data.corpus import CorpusWarning
from lmforge.data.shards import ShardError, shard_corpus, token_dtype, verify
from lmforge.data.stream import ShardCorpus
from lmforge.train.pretrain import read_documents, tokenize_documents
from lmforge.tokenizer import Tokenizer, load_tokenizer
from tests.data.shard_cases import shard_inputs, snapshot


def test_round_trip_equals_tokenizing_directly(corpus_dir, tokenizer_dir, tmp_path):
    manifest = shard_corpus(shard_inputs(corpus_dir), tokenizer_dir, tmp_path / "s", shard_bytes=20_000,
                            log=lambda m: None)
    assert manifest["dtype"] == "uint16" and manifest["complete"] and len(manifest["shards"]) > 4
    corpus = ShardCorpus(tmp_path / "s")
    direct = tokenize_documents(load_tokenizer(tokenizer_dir), read_documents(shard_inputs(corpus_dir)))
    assert len(corpus) == len(direct) == manifest["totals"]["documents"]
    assert [corpus.document(i) for i in range(len(corpus))] == direct
    assert corpus.n_tokens == sum(len(s) for d in direct for s in d) == manifest["totals"]["tokens"]
    assert load_tokenizer(tmp_path / "s" / "tokenizer").vocab_size == load_tokenizer(tokenizer_dir).vocab_size
    assert verify(tmp_path / "s") == []


def test_uint32_when_the_vocabulary_passes_65536_ids(tmp_path):
    assert token_dtype(65536) == np.uint16 and token_dtype(65537) == np.uint32
    vocab = {"[UNK]": 0, **{f"w{i}": i for i in range(1, 70_000)}}
    backend = Backend(WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    (tmp_path / "t.txt").write_text("w69999 w3 w65536. w70001\n\nw1 w2\n")
    manifest = shard_corpus([tmp_path / "t.txt"], Tokenizer(backend, {"unk": "[UNK]"}), tmp_path / "s",
                            log=lambda m: None)
    assert manifest["dtype"] == "uint32"
    assert ShardCorpus(tmp_path / "s").document(0) == [[69999, 3, 0, 0]]
    assert (tmp_path / "s" / "shard-00000.bin").stat().st_size == 6 * 4


def test_one_or_two_workers_write_the_same_shards(corpus_dir, tokenizer_dir, tmp_path):
    for n in (1, 2):
        shard_corpus(shard_inputs(corpus_dir), tokenizer_dir, tmp_path / str(n), workers=n,
                     shard_bytes=20_000, log=lambda m: None)
    assert snapshot(tmp_path / "1") == snapshot(tmp_path / "2")


def test_cli_shards_and_reports_bad_input(corpus_dir, tokenizer_dir, tmp_path, capsys, monkeypatch):
    (tmp_path / "bad.txt").write_bytes(b"Fine.\n\xff\xfe\n")
    args = ["corpus", "shard", str(corpus_dir / "c.txt"), str(tmp_path / "bad.txt"), "--tokenizer",
            str(tokenizer_dir), "--out", str(tmp_path / "s"), "--workers", "2", "--verify"]
    monkeypatch.setattr("sys.argv", ["lmforge", *args])
    assert main() == 0  # as the installed command runs it: its warnings said in one line each
    out = capsys.readouterr()
    assert "2 shards" in out.out and "checksums verified" in out.out
    assert "warning:" in out.err and "bad.txt" in out.err and "offset 6" in out.err
    assert main(["corpus", "shard", str(tmp_path / "nope.txt"), "--tokenizer", str(tokenizer_dir),
                 "--out", str(tmp_path / "t")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_worker_warnings_reach_the_caller(tokenizer_dir, tmp_path):
    (tmp_path / "e.txt").write_bytes(b"")
    (tmp_path / "f.txt").write_text("One sentence here. Another one follows.\n")
    with pytest.warns(CorpusWarning, match="e.txt is empty"):
        manifest = shard_corpus([tmp_path / "e.txt", tmp_path / "f.txt"], tokenizer_dir, tmp_path / "s",
                                log=lambda m: None)
    assert manifest["totals"]["documents"] == 1 and manifest["shards"][0]["problems"]


def test_the_command_says_each_data_warning_in_one_line(tokenizer_dir, tmp_path, monkeypatch, capsys):
    (tmp_path / "c").mkdir()
    texts = [json.dumps({"text": f"Sentence {i} is here. Another one follows."}) for i in range(40)]
    (tmp_path / "c" / "a.jsonl").write_text("\n".join(['not json', '{"title": 1}', *texts]) + "\n")
    for command in (["corpus", "shard", str(tmp_path / "c"), "--tokenizer", str(tokenizer_dir)],
                    ["pretrain", "--preset", "bert-tiny", "--objective", "mlm", "--data", str(tmp_path / "c"),
                     "--tokenizer", str(tokenizer_dir), "--steps", "1", "max_seq_len=32"]):
        monkeypatch.setattr("sys.argv", ["lmforge", *command, "--out", str(tmp_path / command[0])])
        assert main() == 0  # as the installed command runs it: main(None)
        said = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
        name = "corpus shard" if command[0] == "corpus" else command[0]  # the sub-command's whole name
        assert said == [f"lmforge {name}: warning: {tmp_path / 'c' / 'a.jsonl'}: skipped 1 line(s) "
                        "that are not JSON and 1 without a string text field"], said


def test_split_points_cut_at_document_starts(corpus_dir, tmp_path):
    from lmforge.data.corpus import CorpusReader, ReadOptions, read_range

    lines = [json.dumps({"text": f"Doc {i}. Has two sentences."}) for i in range(3000)]
    (tmp_path / "d.jsonl").write_text("\n".join(lines) + "\n")
    for path in (tmp_path / "d.jsonl", corpus_dir / "a.txt"):
        ranges = shards.split_points(path, ReadOptions(), 10_000)
        assert len(ranges) > 3 and ranges[0][0] == 0 and ranges[-1][1] is None
        assert [d for s, e in ranges for d in read_range(path, ReadOptions(), s, e)] == \
            list(CorpusReader([path]))
    assert shards.split_points(corpus_dir / "a.txt", ReadOptions(document="file"), 10_000) == [(0, None)]
    assert shards.split_points(corpus_dir / "b.jsonl.gz", ReadOptions(), 100) == [(0, None)]


def _one_shard(corpus_dir, tokenizer_dir, out):
    shard_corpus([corpus_dir / "a.txt"], tokenizer_dir, out, log=lambda m: None)
    return out / "shard-00000.bin"


def test_a_truncated_shard_is_refused_naming_the_file(corpus_dir, tokenizer_dir, tmp_path):
    binary = _one_shard(corpus_dir, tokenizer_dir, tmp_path / "s")
    binary.write_bytes(binary.read_bytes()[:binary.stat().st_size * 6 // 100])  # cut to 6 %
    with pytest.raises(ShardError, match=f"shard file {binary} is .* bytes, its manifest says .*truncated"):
        ShardCorpus(tmp_path / "s")  # a type of its own: the Python face names what it refuses


def test_a_changed_shard_fails_its_checksum_on_open(corpus_dir, tokenizer_dir, tmp_path):
    binary = _one_shard(corpus_dir, tokenizer_dir, tmp_path / "s")
    data = bytearray(binary.read_bytes())
    data[10] ^= 1  # same size: only the checksum tells
    binary.write_bytes(bytes(data))
    with pytest.raises(ShardError, match="shard-00000.bin does not match its checksum"):
        ShardCorpus(tmp_path / "s")


@pytest.mark.parametrize("field, value, said", [
    ("tokenizer", None, '"tokenizer" lacks the tokenizer\'s sha256'), ("tokenizer", {"sha256": 5}, "sha256"),
    ("sha256", "x", "a shard entry is malformed"), ("sha256", [1], "a shard entry is malformed"),
    ("tokens", None, "a shard entry is malformed")])
def test_a_manifest_field_of_another_kind_is_refused_naming_the_manifest(corpus_dir, tokenizer_dir, tmp_path,
                                                                         field, value, said):
    """A hand-edited manifest was a TypeError or AttributeError traceback when a training run opened it."""
    _one_shard(corpus_dir, tokenizer_dir, tmp_path / "s")
    path = tmp_path / "s" / "manifest.json"
    manifest = json.loads(path.read_text())
    (manifest if field == "tokenizer" else manifest["shards"][0])[field] = value
    path.write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match=f"^{path} is damaged: .*{said}"):  # the tokenizer's: when checked
        ShardCorpus(tmp_path / "s").check_tokenizer(load_tokenizer(tmp_path / "s" / "tokenizer"))


def test_checksums_are_read_once_per_file_per_process(corpus_dir, tokenizer_dir, tmp_path, monkeypatch):
    _one_shard(corpus_dir, tokenizer_dir, tmp_path / "s")
    monkeypatch.setattr(shards, "_VERIFIED", set())
    hashed = []
    real = shards._sha256
    monkeypatch.setattr(shards, "_sha256", lambda path: hashed.append(path.name) or real(path))
    ShardCorpus(tmp_path / "s")
    ShardCorpus(tmp_path / "s")
    assert sorted(hashed) == ["shard-00000.bin", "shard-00000.docs", "shard-00000.sent"]


def test_pretraining_on_a_truncated_shard_exits_2_in_one_line(corpus_dir, tokenizer_dir, tmp_path, capsys):
    binary = _one_shard(corpus_dir, tokenizer_dir, tmp_path / "s")
    binary.write_bytes(binary.read_bytes()[:binary.stat().st_size * 6 // 100])
    args = ["pretrain", "--preset", "bert-tiny", "--objective", "mlm", "--data", str(tmp_path / "s"), "--out",
            str(tmp_path / "run"), "--steps", "2", "progress=false"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "shard-00000.bin" in err and "truncated" in err


@pytest.mark.parametrize("flag, value", [("--shard-mb", "nan"), ("--shard-mb", "0"), ("--workers", "100000"),
                                         ("--workers", "0")])
def test_shard_sizes_and_workers_are_bounded_both_ways(tmp_path, capsys, flag, value):
    from lmforge.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["corpus", "shard", "x.txt", "--tokenizer", "t", "--out", str(tmp_path / "o"), flag, value])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and flag in err and err.count("\n") == 1 and not (tmp_path / "o").exists()


def test_an_out_nested_with_an_input_folder_is_refused_naming_both_before_reading(corpus_dir, tokenizer_dir,
                                                                                  tmp_path, capsys):
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "a.txt").write_text((corpus_dir / "c.txt").read_text())
    for given, out in ((tmp_path / "c", tmp_path / "c" / "sh"), (tmp_path / "c" / "a.txt", tmp_path / "c")):
        args = ["corpus", "shard", str(given), "--tokenizer", str(tokenizer_dir), "--out", str(out)]
        assert main(args) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "FILES" in err and "--out" in err and "lies inside" in err, err
    assert sorted(p.name for p in (tmp_path / "c").iterdir()) == ["a.txt"]  # nothing written


def test_an_earlier_runs_shard_folder_is_never_read_as_text(corpus_dir, tokenizer_dir, tmp_path):
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "a.txt").write_text((corpus_dir / "c.txt").read_text())
    alone = shard_corpus([tmp_path / "c"], tokenizer_dir, tmp_path / "first", log=lambda m: None)
    _one_shard(corpus_dir, tokenizer_dir, tmp_path / "c" / "old")  # a shard folder inside the input
    with pytest.warns(CorpusWarning, match="old: skipped, an lmforge shard folder"):
        again = shard_corpus([tmp_path / "c"], tokenizer_dir, tmp_path / "second", log=lambda m: None)
    assert again["totals"] == alone["totals"] and len(again["inputs"]) == 1
    with pytest.raises(ValueError, match=r"old is an lmforge shard folder, not text \(pretrain's data, "
                                         r"--data, takes it alone\)$"):  # the argument, not the flag alone
        shard_corpus([tmp_path / "c" / "old"], tokenizer_dir, tmp_path / "third", log=lambda m: None)


def test_every_reader_judges_a_shard_folder_by_one_rule(corpus_dir, tokenizer_dir, tmp_path):
    from lmforge.data.corpus import expand_files, is_shard_dir
    from lmforge.data.stream import open_shards

    texts = tmp_path / "texts"  # the user's own manifest.json beside text: text to every reader
    texts.mkdir()
    (texts / "a.txt").write_text((corpus_dir / "c.txt").read_text())
    (texts / "manifest.json").write_text('{"files": ["a.txt"]}')
    assert not is_shard_dir(texts) and open_shards([texts]) is None
    assert [p.name for p in expand_files([texts])] == ["a.txt", "manifest.json"]
    _one_shard(corpus_dir, tokenizer_dir, texts / "old")
    manifest = texts / "old" / "manifest.json"
    manifest.write_text(manifest.read_text()[:40])  # a damaged manifest: its shards are still no text
    assert is_shard_dir(texts / "old")
    with pytest.warns(CorpusWarning, match="old: skipped"):
        assert [p.name for p in expand_files([texts])] == ["a.txt", "manifest.json"]
    with pytest.raises(ShardError, match="cannot read manifest.json"):  # pretrain --data: named, not read
        open_shards([texts / "old"])


def test_a_shard_folder_that_lost_its_manifest_is_refused_naming_it_never_read_as_text(corpus_dir,
                                                                                      tokenizer_dir, tmp_path,
                                                                                      capsys):
    """Its token ids were read as text: 80 lines of undecodable-byte warnings, then "no text"."""
    from lmforge.data.corpus import expand_files, is_shard_dir

    _one_shard(corpus_dir, tokenizer_dir, tmp_path / "texts" / "old")
    (tmp_path / "texts" / "a.txt").write_text((corpus_dir / "c.txt").read_text())
    (tmp_path / "texts" / "old" / "manifest.json").unlink()
    assert is_shard_dir(tmp_path / "texts" / "old") and not is_shard_dir(tmp_path / "texts")
    with pytest.warns(CorpusWarning, match="old: skipped, an lmforge shard folder"):
        assert [p.name for p in expand_files([tmp_path / "texts"])] == ["a.txt"]
    argv = ["pretrain", "--objective", "mlm", "--preset", "bert-tiny",
            "--data", str(tmp_path / "texts" / "old"), "--out", str(tmp_path / "run"), "--steps", "1"]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and "old/manifest.json is missing" in err and "Traceback" not in err, err
    assert not (tmp_path / "run").exists()


def test_inputs_that_hold_no_document_are_refused_and_no_folder_is_left(tokenizer_dir, tmp_path, capsys):
    """A corpus of nothing (every JSONL line without the text field) would train on nothing: the command
    says so, points at the field, and leaves no shard folder a later pretrain would read."""
    data = tmp_path / "a.jsonl"
    data.write_text('{"body": "hello world"}\n{"body": "more words"}\n')
    argv = ["corpus", "shard", str(data), "--tokenizer", str(tokenizer_dir), "--out", str(tmp_path / "s")]
    assert main(argv) == 2  # one line naming the file, its records' fields and --text-field (no warnings)
    err = capsys.readouterr().err.strip().splitlines()
    said = f"{data}: no record has a string \"text\" field (its records' fields: body)"
    assert len(err) == 1 and said in err[0]
    assert "--text-field" in err[0] and not (tmp_path / "s").exists()
    assert main([*argv, "--text-field", "body"]) == 0 and ShardCorpus(tmp_path / "s").n_tokens > 0
    (tmp_path / "t").mkdir()  # an --out that was there: what the run wrote into it goes, the folder stays
    argv[-1] = str(tmp_path / "t")
    assert main(argv) == 2
    assert (tmp_path / "t").is_dir() and not list((tmp_path / "t").iterdir())
    assert main([*argv, "--text-field", "body"]) == 0  # the advice, followed, runs


def test_inputs_of_no_document_name_the_read_options_beside_the_flags(tokenizer_dir, tmp_path):
    """shard_corpus said "another --text-field or --format?", flags a Python caller never gave: the
    ReadOptions fields, text_field and format, beside them."""
    (tmp_path / "a.jsonl").write_text('{"text": ""}\n')
    with pytest.raises(ValueError, match=r"no document to shard .*another text_field or format, --text-field "
                                         r"or --format\?\)$"):
        shard_corpus([tmp_path / "a.jsonl"], tokenizer_dir, tmp_path / "s", log=lambda m: None)
    assert not (tmp_path / "s").exists()


def test_links_planted_in_out_are_replaced_never_written_through(corpus_dir, tokenizer_dir, tmp_path):
    out, target = tmp_path / "s", tmp_path / "elsewhere"
    out.mkdir()
    target.mkdir()
    (target / "keep.txt").write_text("keep\n")
    (out / "tokenizer").symlink_to(target, target_is_directory=True)
    (out / "shard-00000.bin.tmp").symlink_to(target / "keep.txt")  # a temporary name a run writes
    shard_corpus(shard_inputs(corpus_dir), tokenizer_dir, out, log=lambda m: None)
    assert [p.name for p in target.iterdir()] == ["keep.txt"]
    assert (target / "keep.txt").read_text() == "keep\n"
    assert not (out / "tokenizer").is_symlink() and load_tokenizer(out / "tokenizer").vocab_size > 0
    assert verify(out) == [] and not list(out.glob("*.tmp"))


def test_a_link_as_the_output_folder_is_refused_before_any_work(corpus_dir, tokenizer_dir, tmp_path):
    from lmforge.utils.atomic import UnsafePath

    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "s").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    with pytest.raises(UnsafePath, match="s: is a symbolic link"):
        shard_corpus(shard_inputs(corpus_dir), tokenizer_dir, tmp_path / "s", log=lambda m: None)
    assert list((tmp_path / "elsewhere").iterdir()) == []


@pytest.mark.parametrize("field, value, said", [
    ("name", "../outside/shard-00000", '"shards" is not a list of entries named shard-NNNNN'),
    ("name", "/tmp/shard-00000", '"shards" is not a list'), ("dtype", "float16", '"dtype" is \'float16\''),
    ("sha256", None, "a shard entry lacks 'sha256'")])
def test_a_manifest_naming_a_path_a_dtype_or_no_checksum_is_refused(corpus_dir, tokenizer_dir, tmp_path,
                                                                   field, value, said):
    """A shard name was joined to the folder as given (files outside it read, and written on resume), a
    float dtype passed the size and checksum checks, and an entry without checksums was taken unchecked."""
    _one_shard(corpus_dir, tokenizer_dir, tmp_path / "s")
    path = tmp_path / "s" / "manifest.json"
    manifest = json.loads(path.read_text())
    if value is None:
        del manifest["shards"][0][field]
    else:
        (manifest if field == "dtype" else manifest["shards"][0])[field] = value
    path.write_text(json.dumps(manifest))
    with pytest.raises(ShardError, match=f"^{path} is damaged: .*{said}"):
        ShardCorpus(tmp_path / "s")
    if field == "sha256":
        assert verify(tmp_path / "s") == ["shard-00000"]  # named as bad: it was a KeyError


def test_an_unfinished_manifest_naming_a_path_is_never_written_through(corpus_dir, tokenizer_dir, tmp_path):
    files, out = [corpus_dir / "a.txt"], tmp_path / "s"
    shard_corpus(files, tokenizer_dir, out, log=lambda m: None)
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["shards"][0].update(name="../escaped", done=False)
    manifest["complete"] = False
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ShardError, match="is damaged"):
        shard_corpus(files, tokenizer_dir, out, log=lambda m: None)  # the rerun that resumes it
    assert not list(tmp_path.glob("escaped*"))


