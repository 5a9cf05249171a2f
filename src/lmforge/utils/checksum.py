"""The checksums every verified artefact records and checks: of a file (checkpoints, shards, model folders,
indexes), and of a JSON object that holds its own checksum (trainer.json, prune settings, result rows)."""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

BLOCK = 1 << 20  # bytes hashed at a time: large blocks let hashlib release the GIL (threads hash in parallel)


def sha256(path: str | os.PathLike) -> str:
    """Hex sha256 of a file, read in BLOCK-sized pieces."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(BLOCK), b""):
            digest.update(block)
    return digest.hexdigest()


def json_sha256(value: dict, own: str | None = None) -> str:
    """Hex sha256 of a JSON object in one canonical form (keys sorted, no spaces), its field `own` (where it
    keeps this checksum) left out: a changed value is told from the written one."""
    text = json.dumps({k: v for k, v in value.items() if k != own}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def sign(value: dict, key: str) -> dict:
    """The object as JSON reads it back, `key` set to its other fields' checksum (an old one replaced)."""
    # through JSON first (tuples become lists, int keys strings): the checksum of what a reader will see
    value = json.loads(json.dumps({k: v for k, v in value.items() if k != key}))
    return {**value, key: json_sha256(value, key)}


def verify(value, key: str, where, *, what: str = "does not match its checksum (changed or damaged)",
           error: type = ValueError, optional: bool = False) -> dict:
    """`value` if its `key` is the checksum of its other fields, else error(f"{where}: {what}")."""
    if not isinstance(value, dict):
        raise error(f"{where}: {what}")
    if key not in value and optional:  # written before it carried one: the caller reads it unverified
        return value
    if value.get(key) != json_sha256(value, key):
        raise error(f"{where}: {what}")
    return value


def check_files(folder: Path, sums: dict, listed_in: Path, error: type = ValueError) -> None:
    """error naming the first of `sums` (file name in `folder` -> hex sha256, as `listed_in` records them)
    that is missing or does not match: damaged or changed since it was written."""
    for name, want in sums.items():
        if Path(name).name != name or not (folder / name).is_file():
            raise error(f"{folder / name}: missing (listed in {listed_in})")
        if sha256(folder / name) != want:
            raise error(f"{folder / name}: checksum does not match the manifest {listed_in} (damaged or "
                        f"changed)")


def model_digest(model, digest) -> None:
    """Update `digest` with a model's config and a strided sample (up to 1024 values) of every weight:
    cheap enough per query, and any training moves the samples."""
    digest.update(json.dumps(model.config.to_dict(), sort_keys=True, default=str).encode())
    for name, tensor in sorted(model.state_dict().items()):
        flat = tensor.detach().reshape(-1)
        sample = flat[::max(1, flat.numel() // 1024)][:1024]
        digest.update(f"{name}{tuple(tensor.shape)}".encode())
        digest.update(sample.float().cpu().numpy().tobytes())


def model_fingerprint(*models) -> str:
    """16 hex digits that tell models apart by config and weights (model_digest of each, in order)."""
    digest = hashlib.sha256()
    for model in models:
        model_digest(model, digest)
    return digest.hexdigest()[:16]
