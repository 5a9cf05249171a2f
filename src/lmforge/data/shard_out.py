"""What a shard run is given and where it may write: a tokenizer and read options of their types, an output
folder apart from its inputs, and never over a folder of the user's that carries a name the run writes
(its `tokenizer/` is replaced whole), the plan: where its inputs are cut into shards, and the inputs'
checksums that a resume matches beside their sizes and times."""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from lmforge.config.options import OptionsError
from lmforge.data.corpus import CHUNK, ReadOptions, expand_files, open_binary
from lmforge.data.openers import COMPRESSED_FILES
from lmforge.tokenizer import load_tokenizer
from lmforge.tokenizer.wrapper import SAVED_FILES, SUMS_FILE, Tokenizer
from lmforge.utils import checksum
from lmforge.utils.atomic import UnsafePath, overlap, writes_over


def run_settings(tokenizer, options) -> tuple:
    """(the run's Tokenizer, its ReadOptions): a tokenizer directory is read; another tokenizer, or options
    that are no ReadOptions, an OptionsError naming the argument (they failed as AttributeErrors mid-run)."""
    tokenizer = load_tokenizer(tokenizer) if isinstance(tokenizer, (str, os.PathLike)) else tokenizer
    if not isinstance(tokenizer, Tokenizer):
        raise OptionsError(f"tokenizer must be an lmforge Tokenizer or its directory, got "
                           f"{type(tokenizer).__name__}", "tokenizer")
    if options is not None and not isinstance(options, ReadOptions):
        raise OptionsError(f"options must be a ReadOptions, got {type(options).__name__}", "options")
    return tokenizer, options or ReadOptions()


def shard_inputs(files, out, tokenizer=None) -> list:
    """The files of a shard run (expand_files), after an UnsafePath (field "out") where the output folder
    `out` is one of the inputs named, holds one or lies inside an input folder, as the command refuses it,
    is, holds or lies inside a `tokenizer` directory, or holds a tokenizer/ of the user's
    (refuse_foreign_tokenizer). An input a written name is by another name (a hard link, a link as
    out/tokenizer: utils.atomic.writes_over, --out's rule) counts as held."""
    given, target = [files] if isinstance(files, (str, os.PathLike)) else list(files), Path(out).resolve()
    for source in map(Path, given):
        if _meets(source.resolve(), target):
            raise UnsafePath(f"out {out} is, holds or lies inside the input {source}: its shards would be "
                             "read back as text, or written over it; choose an out apart from the inputs",
                             "out")
    if isinstance(tokenizer, (str, os.PathLike)) and _meets(Path(tokenizer).resolve(), target):
        raise UnsafePath(f"out {out} is, holds or lies inside the tokenizer folder {tokenizer}: the shards "
                         "and the run's copy of the tokenizer would be written into it; choose an out apart "
                         "from it", "out")
    refuse_foreign_tokenizer(Path(out))
    return expand_files(given)


# what a shard run writes into out beside its shards (out/tokenizer is replaced whole)
SHARD_WRITES = ("manifest.json", "tokenizer")


def _meets(source: Path, target: Path) -> str | None:
    """How the resolved output folder `target` meets the resolved input `source`: written over (writes_over)
    or nested with it either way (overlap); None where they are apart."""
    return writes_over(source, target, SHARD_WRITES) or overlap(source, target)


def refuse_foreign_tokenizer(out: Path) -> None:
    """UnsafePath (field "out") where out/tokenizer, which a shard run replaces whole, holds anything but
    the files Tokenizer.save writes (a link there is replaced, never written through)."""
    folder = out / "tokenizer"
    if folder.is_symlink() or not folder.exists():
        return
    known = (*SAVED_FILES, SUMS_FILE)
    other = sorted(p.name for p in folder.iterdir() if p.name not in known) if folder.is_dir() else ["a file"]
    if other:
        raise UnsafePath(f"out {out}: its tokenizer holds {', '.join(other[:3])}, not only a tokenizer's "
                         "files; a shard run replaces that folder whole: choose another out", "out")


def _next_document(handle, b: int, jsonl: bool) -> int:
    """The first document start at or after byte b: after a newline (JSONL) or a blank line."""
    handle.seek(b - 1)
    pos, seen_line_end, line_start = b - 1, False, False
    while True:
        line = handle.readline(CHUNK)
        if not line:
            return pos
        blank = line_start and line.endswith(b"\n") and not line.strip()
        pos += len(line)
        if seen_line_end and (jsonl or blank):
            return pos - len(line) if jsonl else pos
        seen_line_end = seen_line_end or line.endswith(b"\n")
        line_start = line.endswith(b"\n")


def split_points(path: Path, opts: ReadOptions, shard_bytes: int) -> list:
    """Byte ranges [(start, end or None)] of a file, cut at document starts every ~shard_bytes."""
    size = path.stat().st_size
    with open_binary(path) as handle:
        if isinstance(handle, COMPRESSED_FILES) or size <= shard_bytes:
            return [(0, None)]  # gzip, bzip2 and xz cannot seek cheaply: one shard
        jsonl = opts.format_of(path) == "jsonl"
        if not jsonl and opts.document == "file":
            return [(0, None)]
        cuts = sorted({_next_document(handle, b, jsonl) for b in range(shard_bytes, size, shard_bytes)})
    starts = [0, *(c for c in cuts if 0 < c < size)]
    return [(s, e) for s, e in zip(starts, [*starts[1:], None])]


def plan(files: list, opts: ReadOptions, shard_bytes: int) -> list:
    """The shards of a corpus: name, input index and byte range, in corpus order."""
    jobs = []
    for i, path in enumerate(files):
        for start, end in split_points(path, opts, shard_bytes):
            jobs.append({"name": f"shard-{len(jobs):05d}", "input": i, "start": start, "end": end})
    return jobs


def input_sums(files: list) -> list:
    """sha256 of each input file's bytes as stored (a compressed one's too), several files at once."""
    # hashlib releases the GIL on large blocks: threads read and hash files side by side
    with ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1)) as pool:
        return list(pool.map(checksum.sha256, files))


def check_input_sums(out: Path, recorded: list, files: list) -> None:
    """ValueError naming the first input whose bytes differ from the checksum `recorded` (the manifest's
    inputs) at the same size and time; one recorded without a checksum (written before they were kept)
    cannot be told unchanged, and is refused too."""
    # size and time alone miss a file rewritten within the clock's tick or its time set back (touch -r):
    # the recorded shards would be kept beside new ones cut from other bytes, a silently wrong corpus
    for entry, path, got in zip(recorded, files, input_sums(files)):
        want = entry.get("sha256")
        if not isinstance(want, str):
            raise ValueError(f"{out} holds shards written before their inputs' checksums were recorded: "
                             f"whether {entry['path']} changed since cannot be told; use another out (--out)")
        if got != want:
            raise ValueError(f"{out} holds shards of other inputs, options or tokenizer ({entry['path']} "
                             f"changed since: its bytes, at the same size and time); use another out (--out)")


def spelled(manifest: dict) -> bool:
    """Whether a manifest's shards keep their <UNK> words' spellings (a word tokenizer's, v2)."""
    return manifest.get("spelled") is True


def changed_header(manifest: dict, header: dict) -> str:
    """What of `header` the recorded manifest differs in: the first input changed since, by name."""
    key = next(k for k in header if manifest.get(k) != header[k])
    was = manifest.get("inputs") if isinstance(manifest.get("inputs"), list) else []
    new = [i["path"] for i in header["inputs"] if i not in was]
    if key in ("version", "spelled") and spelled(header):
        return "they are v1 word shards, written before shards kept the spellings of <UNK> words"
    return (f"{new[0]} is new or changed since (size or time)" if key == "inputs" and new
            else f"its {key} differs")
