"""What the shard tests share: the corpus fixture's files and a snapshot of a shard folder."""
import json

import lmforge.data.shards as shards

FILES = ("a.txt", "b.jsonl.gz", "c.txt")


def shard_inputs(corpus_dir) -> list:
    """The corpus fixture's three files (text, gzipped JSONL, text)."""
    return [corpus_dir / f for f in FILES]


def snapshot(out) -> tuple:
    """Every shard file's bytes and the manifest's shard entries."""
    manifest = json.loads((out / "manifest.json").read_text())
    files = {p.name: p.read_bytes() for p in sorted(out.glob("shard-*"))}
    return files, manifest["shards"]


def interrupt_at(monkeypatch, name: str, leave: tuple = ()) -> None:
    """Make the worker writing shard `name` die with KeyboardInterrupt, the files `leave` (paths) written
    half-way first; every other shard is written as usual (monkeypatch.undo, or a new setattr, restores)."""
    real = shards.write_shard

    def interrupted(job):
        if job["name"] == name:
            for path in leave:
                path.write_bytes(b"\x01\x02")
            raise KeyboardInterrupt
        return real(job)

    monkeypatch.setattr(shards, "write_shard", interrupted)
