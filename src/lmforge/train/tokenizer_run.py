"""A pretraining run's own tokenizer: trained once from its corpus, kept in DIR/tokenizer, read back by a
resume and by the other ranks of a torchrun job, and trained again where the corpus or settings changed."""
from __future__ import annotations

import hashlib
import json
import os
import time
from functools import partial
from pathlib import Path

from lmforge.objectives.registry import TOKENIZER_KINDS
from lmforge.tokenizer import load_tokenizer
from lmforge.tokenizer.wrapper import SUMS_FILE, TokenizerError
from lmforge.utils.atomic import atomic_write_text, replace_dir

# beside the tokenizer's files: the family, vocab_size and corpus it was trained on
TRAINED_ON = "trained_on.json"


def first_rank() -> bool:
    """Whether this is torchrun's first process (RANK 0), or the only one: read before the process group
    exists (distributed.world needs it), as the tokenizer and the corpus are."""
    return int(os.environ.get("RANK", "0")) == 0


def default_tokenizer(family: str, docs: list, vocab_size: int):
    """A tokenizer of `family` (an objective's: bert, roberta, gpt2, t5) trained on the corpus, with the
    subword model of the family's original: WordPiece, byte-level BPE, or a T5 unigram with sentinels."""
    from lmforge.tokenizer import train_tokenizer
    from lmforge.tokenizer.chars import train_words

    text = [" ".join(doc) for doc in docs]
    if TOKENIZER_KINDS[family] == "wordlevel":  # a vocabulary of whole words (ELMo's softmax), no subwords
        return train_words(text, vocab_size)
    return train_tokenizer(text, TOKENIZER_KINDS[family], vocab_size, family=family)


def trained_on(family: str, docs, vocab_size: int) -> dict:
    """What decides a run's tokenizer: its family, vocab_size and the documents (their sha256)."""
    digest, count = hashlib.sha256(), 0
    for count, doc in enumerate(docs, 1):  # one JSON line a document: unambiguous, no copy of the corpus
        digest.update(json.dumps(doc, ensure_ascii=False).encode("utf-8") + b"\n")
    return {"family": family, "vocab_size": vocab_size, "documents": count, "sha256": digest.hexdigest()}


def _holds(path: Path, source: dict) -> bool:
    """Whether `path` holds a tokenizer trained on `source` (none, an unreadable or another record: no; a
    deleted tokenizer.json is trained again, as before the record). One made before the record was kept is
    the run's own, as a resume always took it: trained again now, it could come out otherwise (tokenizer
    training changed since) under the checkpoints' embeddings."""
    if (path / "tokenizer.json").is_file() and not (path / TRAINED_ON).exists():
        return True
    try:
        return (path / "tokenizer.json").is_file() and \
            json.loads((path / TRAINED_ON).read_text(encoding="utf-8")) == source
    except (OSError, ValueError):
        return False


def unsealed(path: Path) -> None:
    """TokenizerError naming SUMS_FILE where a run's tokenizer has its record (TRAINED_ON) but not its
    checksums: every run that kept the record kept them too (Tokenizer.save), so they were removed, and
    load_tokenizer would read the files unverified (as it reads one saved before checksums were kept)."""
    if (path / TRAINED_ON).exists() and not ((path / SUMS_FILE).exists() or (path / SUMS_FILE).is_symlink()):
        raise TokenizerError(f"{path / SUMS_FILE}: missing beside {TRAINED_ON} (the run's tokenizer was "
                             f"written with its checksums: damaged or changed); remove {path} to train it "
                             "again")


def _save(tokenizer, source: dict, folder: Path) -> None:
    tokenizer.save(folder)
    atomic_write_text(folder / TRAINED_ON, json.dumps(source, indent=2) + "\n")


def run_tokenizer(out, family: str, docs: list, vocab_size: int, wait_s: float = 600.0):
    """The run's tokenizer, trained once and kept in DIR/tokenizer with its files' checksums.

    Training is deterministic (lmforge.tokenizer.canonical), but it takes time and memory on a
    large corpus: a resumed run reads the tokenizer it already has (verified), and the ranks of a
    torchrun job read the one rank 0 wrote rather than each training its own. One trained on another
    corpus or with other settings (a killed run's, before its first checkpoint) is trained again, never
    taken: a fresh run on other text must not tokenize it with that tokenizer."""
    tokenizer, keep = pending_tokenizer(out, family, docs, vocab_size, wait_s)
    keep()
    return tokenizer


def pending_tokenizer(out, family: str, docs: list, vocab_size: int, wait_s: float = 600.0) -> tuple:
    """(tokenizer, keep) as run_tokenizer finds or trains it, with nothing written yet: keep() writes one
    trained here to DIR/tokenizer (a no-op for one read back), so a run refused before it writes nothing."""
    docs = list(docs)  # read twice: its checksum, then the training (documents() is a generator)
    path, source = Path(out) / "tokenizer", trained_on(family, docs, vocab_size)
    if _holds(path, source):
        unsealed(path)
        return load_tokenizer(path), already_kept  # verified (Tokenizer.save kept its checksums)
    if not first_rank():  # waits for this corpus's: a stale one is being replaced by rank 0
        deadline = time.monotonic() + wait_s
        while not _holds(path, source):
            if time.monotonic() > deadline:
                raise TimeoutError(f"rank 0 wrote no tokenizer to {path} in {wait_s:.0f} s")
            time.sleep(0.2)
        unsealed(path)
        return load_tokenizer(path), already_kept
    tokenizer = default_tokenizer(family, docs, vocab_size)
    # other ranks see the whole directory (files, checksums, what it was trained on) or nothing
    return tokenizer, partial(replace_dir, path, partial(_save, tokenizer, source))


def already_kept() -> None:
    """keep() of a tokenizer on disk already (read back), or one a run did not train: nothing to write."""
