"""Resuming an interrupted `corpus shard` run: only unfinished shards redone, never from changed inputs."""
import json
import os

import pytest

import lmforge.data.shards as shards
from lmforge.data.shards import shard_corpus
from lmforge.data.stream import ShardCorpus
from tests.data.shard_cases import interrupt_at, shard_inputs, snapshot


def test_resume_after_an_interruption_redoes_only_unfinished_shards(corpus_dir, tokenizer_dir, tmp_path,
                                                                     monkeypatch):
    files, out, real = shard_inputs(corpus_dir), tmp_path / "s", shards.write_shard
    shard_corpus(files, tokenizer_dir, tmp_path / "fresh", shard_bytes=20_000, log=lambda m: None)
    interrupt_at(monkeypatch, "shard-00002", (out / "shard-00002.bin.tmp",))  # a partial temporary file left
    with pytest.raises(KeyboardInterrupt):
        shard_corpus(files, tokenizer_dir, out, shard_bytes=20_000, log=lambda m: None)
    recorded = json.loads((out / "manifest.json").read_text())
    assert [s["done"] for s in recorded["shards"][:3]] == [True, True, False] and not recorded["complete"]
    with pytest.raises(ValueError, match="unfinished"):
        ShardCorpus(out)
    (out / "shard-00001.sent").write_bytes(b"")  # a finished shard damaged since: redone as well
    monkeypatch.setattr(shards, "write_shard", real)
    redone = []
    logged = []
    monkeypatch.setattr(shards, "_run",
                        lambda jobs, workers: (redone.append(j["name"]) or real(j) for j in jobs))
    shard_corpus(files, tokenizer_dir, out, shard_bytes=20_000, log=logged.append)
    assert redone[:2] == ["shard-00001", "shard-00002"] and "shard-00000" not in redone
    assert logged[0].startswith("resuming: 1 of")
    assert snapshot(out) == snapshot(tmp_path / "fresh") and not list(out.glob("*.tmp"))
    (tmp_path / "other.txt").write_text("Something else.\n")
    with pytest.raises(ValueError, match=r"other inputs.*; use another out \(--out\)$"):  # out, not --out
        shard_corpus([tmp_path / "other.txt"], tokenizer_dir, out, log=lambda m: None)
    shard_corpus([tmp_path / "other.txt"], tokenizer_dir, tmp_path / "o", log=lambda m: None)
    (tmp_path / "other.txt").write_text("Something else again.\n")  # the input that changed is named
    with pytest.raises(ValueError, match="other.txt is new or changed since"):
        shard_corpus([tmp_path / "other.txt"], tokenizer_dir, tmp_path / "o", log=lambda m: None)


def test_an_interrupted_run_leaves_no_temporary_file(corpus_dir, tokenizer_dir, tmp_path, monkeypatch):
    """Ctrl-C with --workers 2 left the workers' half-written shard-NNNNN.*.tmp files in --out."""
    out = tmp_path / "s"
    interrupt_at(monkeypatch, "shard-00001", (out / "shard-00001.bin.tmp", out / "shard-00001.sent.tmp"))
    with pytest.raises(KeyboardInterrupt):
        shard_corpus(shard_inputs(corpus_dir), tokenizer_dir, out, shard_bytes=20_000, log=lambda m: None)
    assert not list(out.glob("*.tmp")) and (out / "shard-00000.bin").is_file()


def test_an_input_changed_at_the_same_size_and_time_is_never_resumed(corpus_dir, tokenizer_dir, tmp_path,
                                                                      monkeypatch):
    source, out, real = tmp_path / "a.txt", tmp_path / "s", shards.write_shard
    source.write_bytes((corpus_dir / "a.txt").read_bytes())
    interrupt_at(monkeypatch, "shard-00001")
    with pytest.raises(KeyboardInterrupt):
        shard_corpus([source], tokenizer_dir, out, shard_bytes=20_000, log=lambda m: None)
    monkeypatch.setattr(shards, "write_shard", real)
    was, stat = snapshot(out), source.stat()
    text = source.read_bytes()  # shard-00000's bytes edited, the size and the time as they were
    source.write_bytes(text.replace(b"e", b"o", 1))
    os.utime(source, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    with pytest.raises(ValueError, match=f"{source} changed since: its bytes, at the same size and time"):
        shard_corpus([source], tokenizer_dir, out, shard_bytes=20_000, log=lambda m: None)
    assert snapshot(out) == was  # nothing kept or written from the other bytes
    manifest = json.loads((out / "manifest.json").read_text())
    del manifest["inputs"][0]["sha256"]  # a folder written before the checksums were kept: not told unchanged
    (out / "manifest.json").write_text(json.dumps(manifest))
    source.write_bytes(text)
    os.utime(source, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    with pytest.raises(ValueError, match=f"whether {source} changed since cannot be told"):
        shard_corpus([source], tokenizer_dir, out, shard_bytes=20_000, log=lambda m: None)


def test_finished_shards_go_on_record_at_most_every_so_often(corpus_dir, tokenizer_dir, tmp_path,
                                                              monkeypatch):
    """The manifest (an entry a shard) was rewritten after every shard: quadratic in many small files."""
    real, written = shards._write_manifest, []
    monkeypatch.setattr(shards, "_write_manifest", lambda out, m: written.append(out) or real(out, m))
    monkeypatch.setattr(shards, "RECORD_EVERY_S", 1e9)
    made = shard_corpus(shard_inputs(corpus_dir), tokenizer_dir, tmp_path / "a", shard_bytes=20_000,
                        log=lambda m: None)
    assert len(made["shards"]) >= 3 and len(written) == 2  # the plan, then the finished run
    monkeypatch.setattr(shards, "RECORD_EVERY_S", 0.0)  # every shard on record as it lands
    written.clear()
    again = shard_corpus(shard_inputs(corpus_dir), tokenizer_dir, tmp_path / "b", shard_bytes=20_000,
                         log=lambda m: None)
    assert len(written) == len(again["shards"]) + 2 and snapshot(tmp_path / "a") == snapshot(tmp_path / "b")


def test_a_failed_record_at_an_error_leaves_no_temporary_file(corpus_dir, tokenizer_dir, tmp_path,
                                                               monkeypatch):
    """A full disk fails a shard and then the manifest's write at the error: that second failure hid the
    first and left the shard's .tmp files."""
    out, real, failed = tmp_path / "s", shards._write_manifest, []

    def full_disk(job):
        if job["name"] == "shard-00001":
            (out / "shard-00001.bin.tmp").write_bytes(b"\x01\x02")
            failed.append(job["name"])
            raise OSError(28, "No space left on device")
        return shards.write_shard(job)

    def record(where, manifest):
        if failed:
            raise OSError(28, "No space left on device (manifest)")
        real(where, manifest)

    monkeypatch.setattr(shards, "_run", lambda jobs, workers: (full_disk(j) for j in jobs))
    monkeypatch.setattr(shards, "_write_manifest", record)
    with pytest.raises(OSError, match=r"device$"):
        shard_corpus(shard_inputs(corpus_dir), tokenizer_dir, out, shard_bytes=20_000, log=lambda m: None)
    assert failed == ["shard-00001"] and not list(out.glob("*.tmp"))
