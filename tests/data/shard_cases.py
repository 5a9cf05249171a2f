"""What the shard tests share: the corpus fixture's files and a snapshot of a shard folder."""
import json

FILES = ("a.txt", "b.jsonl.gz", "c.txt")


def shard_inputs(corpus_dir) -> list:
    """The corpus fixture's three files (text, gzipped JSONL, text)."""
    return [corpus_dir / f for f in FILES]


def snapshot(out) -> tuple:
    """Every shard file's bytes and the manifest's shard entries."""
    manifest = json.loads((out / "manifest.json").read_text())
    files = {p.name: p.read_bytes() for p in sorted(out.glob("shard-*"))}
    return files, manifest["shards"]
