"""Pre-tokenised shards: token ids on disk for memory mapping, with document and sentence boundaries.

A shard directory holds

    manifest.json        format/version, the tokenizer (sha256 of its tokenizer.json, vocab size),
                         dtype, read options, the inputs (path, size, mtime, sha256), and per shard: its
                         input and byte range, done, documents/sentences/tokens, sha256 of each file
    tokenizer/           the tokenizer the ids come from (the directory is self-contained)
    shard-00000.bin      token ids, little-endian uint16 when the vocabulary fits 65536 ids, else uint32
    shard-00000.sent     int64: token offset of each sentence start, then the token count (S + 1)
    shard-00000.docs     int64: sentence index of each document start, then S (D + 1)
    shard-00000.oov      a word tokenizer's shards (v2, "spelled"): the spellings of their <UNK> words,
    shard-00000.oovtext  read where the biLM feeds every word its own characters (shard_oov.py)

A shard is one input file, or one byte range of a large uncompressed file cut at a
document start (`shard_bytes`), so the plan depends on the inputs and options only.
Shards are written by `workers` processes, each shard by one worker into temporary
files renamed when complete; the parent records a finished shard in the manifest
(atomically) as it arrives. A rerun with the same inputs (size and time, then their bytes' sha256:
each input is read once more, cheap beside tokenising it) skips recorded shards whose files are
intact and redoes the others; any number of workers gives the same bytes.
Opening a complete shard directory (`read_manifest`, hence every training run) checks each
file's size against its counts and its sha256 against the manifest, once per file per process.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import multiprocessing as mp
import os
import re
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from itertools import chain
from pathlib import Path

import numpy as np

from lmforge.config import atomic_write_text
from lmforge.config.options import checked_argument
from lmforge.data.corpus import SHARD_FORMAT, CorpusWarning, ReadOptions, read_range
from lmforge.data.shard_oov import (OOV_SUFFIXES, PAIR, encode_documents, keeps_spellings, oov_records,
                                    sentence_parts)
from lmforge.data.shard_out import (changed_header, check_input_sums, input_sums, plan,  # noqa: F401
                                    run_settings, shard_inputs, spelled, split_points)  # (shards.*)
from lmforge.utils import jsontext
from lmforge.utils.atomic import refuse_link, remove_path, replace_dir
from lmforge.utils.checksum import sha256 as _sha256  # a name of its own: tests count the files it hashes
from lmforge.utils.ranks import one_process

# v2: a word tokenizer's shards, spelled; a subword tokenizer's are v1 still, byte for byte as they were
FORMAT, VERSION, SPELLED_VERSION = SHARD_FORMAT, 1, 2
MAX_WORKERS, MIN_SHARD_MB, MAX_SHARD_MB, MB = 256, 0.001, 65536.0, 1 << 20  # --workers, --shard-mb's bounds
SUFFIXES = (".bin", ".sent", ".docs")
SHARD_NAME = re.compile(r"shard-[0-9]{5,}")  # plan's names: a file of the folder, never a path
OFFSET = np.dtype("<i8")
BATCH_SENTENCES = 4096  # sentences tokenised per encode_batch call


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id fits in 16 bits, else uint32 (little-endian)."""
    return np.dtype("<u2") if vocab_size <= 1 << 16 else np.dtype("<u4")


def suffixes(is_spelled: bool) -> tuple:
    """The files of each shard: three, and the spellings' two where the shards are spelled."""
    return SUFFIXES + OOV_SUFFIXES if is_spelled else SUFFIXES


class ShardWriter:
    """Writes one shard's files (as .tmp until `close`), hashing them on the way; `spelled`: sentences are
    (ids, spellings) and the spellings are kept (shard_oov.py)."""

    def __init__(self, out: Path, name: str, dtype: np.dtype, spelled: bool = False) -> None:
        self.suffixes, self.spelled = suffixes(spelled), spelled
        self.paths = [out / f"{name}{s}" for s in self.suffixes]
        self.files = [_fresh(p.with_name(p.name + ".tmp")) for p in self.paths]
        self.hashes = [hashlib.sha256() for _ in self.suffixes]
        self.dtype, self.limit = dtype, np.iinfo(dtype).max
        self.tokens = self.sentences = self.documents = self.oov = self.oov_bytes = 0
        self._write(1, np.zeros(1, OFFSET))
        self._write(2, np.zeros(1, OFFSET))

    def _write(self, k: int, array: np.ndarray) -> None:
        data = array.tobytes()
        self.files[k].write(data)
        self.hashes[k].update(data)

    def add(self, docs: list) -> None:
        """Append documents, each a list of sentence id lists, or (ids, spellings) where `spelled` (empty
        ones are dropped)."""
        docs = [[s for s in doc if sentence_parts(s)[0]] for doc in docs]
        docs = [doc for doc in docs if doc]
        if self.spelled:  # the token offsets they record start at the tokens written so far
            pairs, text = oov_records([s for doc in docs for s in doc], self.tokens, self.oov_bytes)
            self._write(3, pairs)
            self._write(4, np.frombuffer(text, np.uint8))
            self.oov, self.oov_bytes = self.oov + len(pairs), self.oov_bytes + len(text)
            docs = [[ids for ids, _ in doc] for doc in docs]
        sentences = [s for doc in docs for s in doc]
        lengths = np.fromiter(map(len, sentences), dtype=OFFSET, count=len(sentences))
        ids = np.fromiter(chain.from_iterable(sentences), dtype=np.int64, count=int(lengths.sum()))
        if ids.size and (ids.min() < 0 or ids.max() > self.limit):
            raise ValueError(f"token id {int(ids.max())} does not fit {self.dtype.name}")
        self._write(0, ids.astype(self.dtype))
        self._write(1, self.tokens + np.cumsum(lengths))
        per_doc = np.array([len(doc) for doc in docs], dtype=OFFSET)
        self._write(2, self.sentences + np.cumsum(per_doc))
        self.tokens += int(lengths.sum())
        self.sentences += len(lengths)
        self.documents += len(docs)

    def close(self) -> dict:
        """Rename the files into place; their counts and checksums."""
        for f, p in zip(self.files, self.paths):
            f.close()
            os.replace(p.with_name(p.name + ".tmp"), p)
        spelt = {"oov": self.oov, "oov_bytes": self.oov_bytes} if self.spelled else {}
        return {"documents": self.documents, "sentences": self.sentences, "tokens": self.tokens, **spelt,
                "sha256": {s.lstrip("."): h.hexdigest() for s, h in zip(self.suffixes, self.hashes)}}


def _fresh(path: Path):
    """A new file at `path` opened for writing: what a killed run left there (a link too: the link, not
    what it points to) is removed first, and the file is created anew, never opened through a link."""
    path.unlink(missing_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    return os.fdopen(os.open(path, flags, 0o666), "wb")


def write_shard(job: dict) -> dict:
    """Tokenise one shard's documents into its files (run in a worker process); its manifest entry."""
    from lmforge.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(job["tokenizer"])
    backend, unk = tokenizer.backend, tokenizer.special_id("unk") if job["spelled"] else None
    opts = ReadOptions(**job["options"])
    writer = ShardWriter(Path(job["out"]), job["name"], np.dtype(job["dtype"]), job["spelled"])
    batch, n = [], 0
    reader = read_range(Path(job["path"]), opts, job["start"], job["end"], warn=False)
    while True:
        try:
            doc = next(reader)
        except StopIteration as stop:
            stats = stop.value
            break
        batch.append(doc)
        n += len(doc)
        if n >= BATCH_SENTENCES:
            writer.add(encode_documents(backend, batch, unk))
            batch, n = [], 0
    writer.add(encode_documents(backend, batch, unk))
    entry = {k: job[k] for k in ("name", "input", "start", "end")}
    return {**entry, "done": True, **writer.close(), "problems": stats.problems}


def _expected(out: Path, entry: dict, itemsize: int, is_spelled: bool) -> list:
    """[(path, size its counts imply, suffix)] of a recorded shard's files."""
    sizes = (entry["tokens"] * itemsize, (entry["sentences"] + 1) * 8, (entry["documents"] + 1) * 8,
             *((entry["oov"] * 2 * PAIR.itemsize, entry["oov_bytes"]) if is_spelled else ()))
    return [(out / f"{entry['name']}{s}", n, s) for s, n in zip(suffixes(is_spelled), sizes)]


# (path, size, mtime_ns) of the shard files whose checksum matched in this process: each is hashed once
_VERIFIED: set = set()
REDO = "rerun `lmforge corpus shard` with the same inputs to rewrite it"


class ShardError(ValueError):
    """A shard folder that cannot be trusted (a file missing, cut or changed; its manifest lost or damaged):
    the message names the file."""


def check_files(out, shards: list, itemsize: int, is_spelled: bool = False) -> None:
    """ShardError naming the first file of `shards` (manifest entries) that is missing, of another
    size than its counts imply (truncated), or whose sha256 differs: sizes always, checksums once per
    file per process."""
    out, todo = Path(out), []
    for entry in shards:
        for path, size, suffix in _expected(out, entry, itemsize, is_spelled):
            if not path.is_file():
                raise ShardError(f"shard file {path} is missing; {REDO}")
            stat = path.stat()
            if stat.st_size != size:
                raise ShardError(f"shard file {path} is {stat.st_size} bytes, its manifest says {size} "
                                 f"(truncated or damaged); {REDO}")
            key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
            want = entry["sha256"][suffix.lstrip(".")]  # none recorded: damaged, never taken unchecked
            if key not in _VERIFIED:
                todo.append((path, want, key))
    # hashlib releases the GIL on large blocks: threads hash several files at once
    with ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1)) as pool:
        for (path, want, key), got in zip(todo, pool.map(lambda t: _sha256(t[0]), todo)):
            if got != want:
                raise ShardError(f"shard file {path} does not match its checksum in the manifest "
                                 f"(changed or damaged); {REDO}")
            _VERIFIED.add(key)


def _intact(out: Path, entry: dict, itemsize: int, is_spelled: bool) -> bool:
    """Whether a recorded shard's files exist with the sizes its counts imply and their checksums."""
    try:
        check_files(out, [entry], itemsize, is_spelled)
    except (ValueError, KeyError, TypeError, AttributeError):  # damaged, or its record is: redone
        return False
    return True


def read_manifest(out, check: bool = True) -> dict:
    """The manifest of a shard directory; when complete and `check`, its files verified against it
    (check_files) so a truncated or damaged shard is never trained on."""
    path = Path(out) / "manifest.json"
    try:
        manifest = jsontext.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:  # lost beside its shards (corpus.is_shard_dir): their record is gone
        raise ShardError(f"{path} is missing: nothing records what the shards hold; rerun `lmforge corpus "
                         f"shard` with the same inputs to rewrite it") from None
    except (OSError, ValueError) as err:
        raise ShardError(f"{out} is not a shard directory (cannot read manifest.json: {err})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT or manifest.get("version") not in (
            VERSION, SPELLED_VERSION):
        raise ShardError(f"{path} is not an {FORMAT} v{VERSION} or v{SPELLED_VERSION} manifest")
    _check_shape(path, manifest)
    if check and manifest.get("complete"):
        try:
            check_files(out, manifest["shards"], np.dtype(manifest["dtype"]).itemsize, spelled(manifest))
        except (KeyError, TypeError, AttributeError) as err:  # a field missing, or of another kind
            what = f"lacks {err}" if isinstance(err, KeyError) else f"is malformed ({err})"
            raise ShardError(f"{path} is damaged: a shard entry {what}") from None
    return manifest


def _check_shape(path: Path, manifest: dict) -> None:
    """ShardError unless the manifest's shard names and dtype are ones `shard_corpus` writes."""
    entries = manifest.get("shards")
    # a name is joined to the folder to read and write: "../x" or "/x" would reach files outside it
    if not isinstance(entries, list) or not all(isinstance(e, dict) and isinstance(e.get("name"), str)
                                                and SHARD_NAME.fullmatch(e["name"]) for e in entries):
        raise ShardError(f"{path} is damaged: \"shards\" is not a list of entries named shard-NNNNN")
    dtype = manifest.get("dtype")
    if dtype not in ("uint16", "uint32"):  # float16 ids would pass the size and checksum checks
        raise ShardError(f"{path} is damaged: \"dtype\" is {dtype!r}, not uint16 or uint32")
    if spelled(manifest) != (manifest["version"] == SPELLED_VERSION):  # spellings kept exactly where v2
        raise ShardError(f"{path} is damaged: \"spelled\" does not go with v{manifest['version']}")


# finished shards go on record at most this often: a manifest (an entry a shard) rewritten after every
# shard made a run of many small files quadratic (100,000 files: over 28 minutes)
RECORD_EVERY_S = 1.0


def _write_manifest(out: Path, manifest: dict) -> None:
    atomic_write_text(out / "manifest.json", json.dumps(manifest, indent=1) + "\n")


def _header(files: list, tokenizer, tok_sha: str, opts: ReadOptions, shard_bytes: int) -> dict:
    """What a rerun must match to resume: tokenizer, options and the inputs as they were."""
    inputs = [{"path": str(f.resolve()), "bytes": f.stat().st_size, "mtime_ns": f.stat().st_mtime_ns}
              for f in files]
    spelt = keeps_spellings(tokenizer)  # a word tokenizer's: v2, which v1's readers refuse
    return {"format": FORMAT, "version": SPELLED_VERSION if spelt else VERSION,
            "tokenizer": {"sha256": tok_sha, "vocab_size": tokenizer.vocab_size},
            "dtype": token_dtype(tokenizer.vocab_size).name, "options": opts.to_dict(),
            "shard_bytes": shard_bytes, "inputs": inputs, **({"spelled": True} if spelt else {})}


def _prepare(files, tokenizer, out: Path, opts: ReadOptions, shard_bytes: int) -> dict:
    """The manifest to continue: the recorded one when it matches these inputs, else a new plan."""
    text = tokenizer.backend.to_str(pretty=True)
    header = _header(files, tokenizer, hashlib.sha256(text.encode()).hexdigest(), opts, shard_bytes)
    if (out / "manifest.json").is_file():
        manifest = read_manifest(out, check=False)  # damaged shards are redone, not refused
        recorded = manifest.get("inputs") if isinstance(manifest.get("inputs"), list) else []
        stated = {**manifest, "inputs": [{k: v for k, v in i.items() if k != "sha256"} if isinstance(i, dict)
                                         else i for i in recorded]}  # size and time first: no file read
        if {k: stated.get(k) for k in header} != header:
            raise ValueError(f"{out} holds shards of other inputs, options or tokenizer "
                             f"({changed_header(stated, header)}); use another out (--out)")
        check_input_sums(out, recorded, files)
        return manifest
    header["inputs"] = [{**i, "sha256": s} for i, s in zip(header["inputs"], input_sums(files))]
    replace_dir(out / "tokenizer", tokenizer.save)  # whole, and a link there replaced, never written through
    manifest = {**header, "shards": [{**job, "done": False} for job in plan(files, opts, shard_bytes)],
                "complete": False}
    _write_manifest(out, manifest)
    return manifest


def shard_corpus(files, tokenizer, out, workers: int = 1, options: ReadOptions | None = None,
                 shard_bytes: int = 64 << 20, log=print) -> dict:
    """Tokenise text files into a shard directory `out` with `workers` processes; the manifest.

    `tokenizer` is a Tokenizer or a directory. Resumes a directory left unfinished."""
    one_process("shard_corpus")
    workers = checked_argument("workers", "int", {"low": 1, "high": MAX_WORKERS}, workers)  # as --workers is
    shard_bytes = checked_argument("shard_bytes", "int", {"low": int(MIN_SHARD_MB * MB),
                                                          "high": int(MAX_SHARD_MB * MB)}, shard_bytes)
    files = shard_inputs(files, out, tokenizer)  # out neither is, holds nor lies inside an input
    tokenizer, opts = run_settings(tokenizer, options)
    out = refuse_link(out)
    made = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    manifest = _prepare(files, tokenizer, out, opts, shard_bytes)
    itemsize, spelt = np.dtype(manifest["dtype"]).itemsize, spelled(manifest)
    todo = [s for s in manifest["shards"] if not (s["done"] and _intact(out, s, itemsize, spelt))]
    if len(todo) < len(manifest["shards"]):
        log(f"resuming: {len(manifest['shards']) - len(todo)} of {len(manifest['shards'])} "
            f"shards already done")
    jobs = [{**{k: s[k] for k in ("name", "input", "start", "end")},
             "path": manifest["inputs"][s["input"]]["path"],
             "tokenizer": str(out / "tokenizer"), "options": manifest["options"], "dtype": manifest["dtype"],
             "out": str(out), "spelled": spelt} for s in todo]
    _write_all(out, manifest, jobs, workers, log)
    manifest["totals"] = {k: sum(s[k] for s in manifest["shards"])
                          for k in ("documents", "sentences", "tokens")}
    _refuse_empty(out, manifest, files, made)
    manifest["complete"] = True
    _write_manifest(out, manifest)
    return manifest


def _write_all(out: Path, manifest: dict, jobs: list, workers: int, log) -> None:
    """Run the jobs, recording finished shards in the manifest as they land (at most every RECORD_EVERY_S;
    the caller records the last). An interrupted run (Ctrl-C, an error) leaves its finished shards on record
    and no temporary file, its workers' included; a killed one redoes the last second's shards."""
    index = {s["name"]: i for i, s in enumerate(manifest["shards"])}
    entries, recorded = _run(jobs, workers), time.monotonic()
    try:
        for entry in entries:
            manifest["shards"][index[entry["name"]]] = entry
            if time.monotonic() - recorded >= RECORD_EVERY_S:
                _write_manifest(out, manifest)
                recorded = time.monotonic()
            for message in entry["problems"]:
                warnings.warn(message, CorpusWarning, stacklevel=3)
            log(f"{entry['name']}: {entry['documents']} documents, {entry['tokens']} tokens")
    except BaseException:
        entries.close()  # the pool's workers end (terminated, joined) before their files are removed
        for job in jobs:
            for suffix in suffixes(spelled(manifest)):
                (out / f"{job['name']}{suffix}.tmp").unlink(missing_ok=True)
        with contextlib.suppress(OSError):  # a full disk fails this too: the run's own error is the one told
            _write_manifest(out, manifest)  # (unrecorded shards are redone on resume)
        raise


def _refuse_empty(out: Path, manifest: dict, files: list, made: bool) -> None:
    """A ValueError where the inputs held no document (a corpus of nothing would train on nothing), after
    removing what the run wrote (the folder it made; else its manifest, tokenizer and shard files), so a
    rerun with another --text-field or --format starts afresh."""
    if manifest["totals"]["documents"]:
        return
    shard_files = [out / f"{s['name']}{suffix}" for s in manifest["shards"]
                   for suffix in suffixes(spelled(manifest))]
    written = [out] if made else [out / "manifest.json", out / "tokenizer", *shard_files]
    for path in written:
        remove_path(path)
    named = ", ".join(map(str, files[:3])) + (" ..." if len(files) > 3 else "")
    raise ValueError(f"{named}: no document to shard (the warnings say what was skipped: another "
                     f"text_field or format, --text-field or --format?)")


def _run(jobs: list, workers: int):
    """Shard entries as the jobs finish: in this process, or from a pool of `workers`."""
    if workers == 1 or len(jobs) <= 1:
        yield from map(write_shard, jobs)
        return
    ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")  # fork: no re-import
    saved = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one process per core is the parallelism
    try:
        with ctx.Pool(min(workers, len(jobs))) as pool:
            yield from pool.imap_unordered(write_shard, jobs)
    finally:
        if saved is None:
            os.environ.pop("TOKENIZERS_PARALLELISM", None)
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = saved


def verify(out) -> list:
    """Names of the shards whose files are missing or differ from the manifest's checksums (re-read)."""
    out, manifest = Path(out), read_manifest(out, check=False)
    bad = []
    for s in manifest["shards"]:
        files = [out / f"{s['name']}{suffix}" for suffix in suffixes(spelled(manifest))]
        sums = s.get("sha256")
        if not (s.get("done") and isinstance(sums, dict) and all(f.is_file() for f in files)) or any(
                _sha256(f) != sums.get(f.suffix.lstrip(".")) for f in files):
            bad.append(s["name"])
    return bad
