"""Opening a corpus file: its bytes, decompressed when it is gzip, bzip2 or xz (told by its magic bytes,
whatever its name), refused when it is UTF-16 / UTF-32; a damaged stream's error caught and named."""
from __future__ import annotations

import bz2
import gzip
import lzma
import zlib
from pathlib import Path

# compressed files by their magic bytes: (opener, name); read as text, their bytes would be junk documents
COMPRESSED = {b"\x1f\x8b": (gzip.open, "gzip"), b"BZh": (bz2.open, "bzip2"),
              b"\xfd7zXZ\x00": (lzma.open, "xz")}
# bzip2's "BZh" is text too ("BZh is ..."): its block size digit and a block's (or the end's) magic follow
BZIP2_NEXT = (b"1AY&SY", b"\x17rE8P\x90")
COMPRESSED_FILES = (gzip.GzipFile, bz2.BZ2File, lzma.LZMAFile)  # no cheap seek: one shard each (shards.py)
# a damaged stream: gzip's and xz's own errors, EOFError when cut (bzip2's "Invalid data stream" is an
# OSError, caught for a bzip2 stream alone: a plain file's I/O error is no damaged data)
STREAM_ERRORS = (EOFError, gzip.BadGzipFile, zlib.error, lzma.LZMAError)

# UTF-32 and UTF-16 byte-order marks (UTF-32's first: UTF-16 LE's is its start), as iconv names them
WIDE_MARKS = {b"\xff\xfe\x00\x00": "UTF-32LE", b"\x00\x00\xfe\xff": "UTF-32BE", b"\xff\xfe": "UTF-16LE",
              b"\xfe\xff": "UTF-16BE"}
PROBE = 4096  # bytes of a file looked at to tell it is no UTF-8 text: NULs in a quarter of them


def _compression(head: bytes) -> tuple:
    """(opener, name) of the compressed format `head` starts with, or (open, "")."""
    found = next((v for magic, v in COMPRESSED.items() if head.startswith(magic)), (open, ""))
    if found[1] == "bzip2" and not (head[3:4].isdigit() and head[3:4] != b"0" and head[4:10] in BZIP2_NEXT):
        return open, ""
    return found


def compression(path: Path) -> str:
    """The compressed format a file is in ("gzip", "bzip2", "xz"; "" for plain bytes), told by its magic
    bytes alone, no decompressor opened; a UTF-16 / UTF-32 file is a ValueError naming it (open_binary's)."""
    return _probe(path)[1]


def open_binary(path: Path):
    """The file's bytes, decompressed when it starts with gzip's, bzip2's or xz's magic number; a UTF-16 /
    UTF-32 file (its byte-order mark, or NULs in a quarter of its first bytes) is a ValueError naming it."""
    return _probe(path)[0](path, "rb")


def _probe(path: Path) -> tuple:
    """(opener, name) of the file's compressed format (_compression) from its first bytes, or the ValueError
    of a UTF-16 / UTF-32 file."""
    with open(path, "rb") as probe:
        head = probe.read(PROBE)
    wide = next((name for mark, name in WIDE_MARKS.items() if head.startswith(mark)), None)
    opener, packed = _compression(head)
    if wide or (not packed and head.count(0) > len(head) // 4):
        what = (f"{wide} text" if wide else f"{head.count(0)} NUL bytes in its first {len(head)}: UTF-16 or "
                "UTF-32 text without a byte-order mark, or no text")
        raise ValueError(f"{path}: {what}; lmforge reads UTF-8 (iconv -f {wide or 'UTF-16LE'} -t UTF-8 "
                         f"{path} > out.txt)")
    return opener, packed


def read_some(handle, want: int) -> tuple:
    """(up to `want` bytes, the error that stopped a damaged gzip stream early or None)."""
    parts, n = [], 0
    try:
        while n < want:
            got = handle.read1(want - n)  # read1: what came before damage is not lost with it
            if not got:
                break
            parts.append(got)
            n += len(got)
    except (*STREAM_ERRORS, OSError) as err:
        if not stream_damage(handle, err):
            raise
        return b"".join(parts), err
    return b"".join(parts), None


def stream_damage(handle, error) -> bool:
    """Whether `error` is damage in a compressed stream (a plain file's I/O error is not)."""
    bzip2 = isinstance(handle, bz2.BZ2File) and isinstance(error, OSError)
    return isinstance(handle, COMPRESSED_FILES) and (isinstance(error, STREAM_ERRORS) or bzip2)


def damage(handle, error) -> str:
    """What a damaged compressed stream's warning says."""
    name = {gzip.GzipFile: "gzip", bz2.BZ2File: "bzip2", lzma.LZMAFile: "xz"}.get(type(handle), "compressed")
    return f"damaged {name} data ({error})"
