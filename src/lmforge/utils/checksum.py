"""The one file checksum every verified artefact records and checks: checkpoints, shards, model folders."""
from __future__ import annotations

import hashlib
import os

BLOCK = 1 << 20  # bytes hashed at a time: large blocks let hashlib release the GIL (threads hash in parallel)


def sha256(path: str | os.PathLike) -> str:
    """Hex sha256 of a file, read in BLOCK-sized pieces."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(BLOCK), b""):
            digest.update(block)
    return digest.hexdigest()
