"""The spellings a word tokenizer's shards keep: each <UNK> word's own text, sparsely, so that a biLM
trained from shards feeds the character CNN every word's own characters, as one trained from the same
text does (tokenizer/chars.spelled_ids; bilm-tf reads the raw words). Beside a shard's three files:

    shard-00000.oov      int64 pairs, one per <UNK> word: its token offset in the shard, and where its
                         spelling ends in .oovtext (it starts where the one before ends) (U x 2)
    shard-00000.oovtext  the spellings' UTF-8 bytes, one after another

Subword tokenizers have no <UNK> word to spell (byte-level BPE has none at all): their shards keep ids.
"""
from __future__ import annotations

from bisect import bisect_right
from pathlib import Path

import numpy as np
from tokenizers.models import WordLevel

from lmforge.tokenizer.chars import unk_spellings
from lmforge.tokenizer.wrapper import as_text

OOV_SUFFIXES = (".oov", ".oovtext")
PAIR = np.dtype("<i8")  # .oov's items: (token offset, end byte) pairs


def keeps_spellings(tokenizer) -> bool:
    """Whether shards of `tokenizer` keep its <UNK> words' spellings: a word tokenizer's (tokenizer/chars.py:
    a WordLevel model, every other word read as its unknown token)."""
    return isinstance(tokenizer.backend.model, WordLevel) and tokenizer.special_id("unk") is not None


def sentence_parts(sentence) -> tuple:
    """(ids, {position: spelling} or None) of a sentence, given as its id list or as a word tokenizer's
    (ids, spellings) (tokenizer/chars.spelled_ids, encode_documents): the one reading of both forms."""
    return sentence if isinstance(sentence, tuple) else (sentence, None)


def encode_documents(backend, docs: list, unk: int | None = None) -> list:
    """Documents of sentence strings -> documents of sentence id lists (no special tokens); with `unk` (a
    word tokenizer's) each sentence is (ids, {position: spelling} of its <UNK> words), as spelled_ids."""
    texts = [s for doc in docs for s in doc]
    if not texts:
        flat = []
    elif unk is None:  # no offsets: the fast path
        flat = [e.ids for e in _encoded(backend.encode_batch_fast, texts)]
    else:  # offsets: the spellings are the text's own
        flat = [(e.ids, unk_spellings(text, e.ids, e.offsets, unk))
                for text, e in zip(texts, _encoded(backend.encode_batch, texts))]
    out, i = [], 0
    for doc in docs:
        out.append(flat[i:i + len(doc)])
        i += len(doc)
    return out


def _encoded(encode, texts: list) -> list:
    """`encode(texts)` without special tokens; a failure is said as Tokenizer.encode says it: a text that
    is not UTF-8 (a JSON record's lone surrogate "\\ud800") as as_text, else a ValueError of the backend's."""
    try:
        return encode(texts, add_special_tokens=False)
    except Exception as err:  # noqa: BLE001 - the backend's TypeError "TextEncodeInput must be" names no text
        for text in texts:
            as_text(text)
        raise ValueError(f"cannot encode: {err}") from None


def oov_records(sentences: list, first_token: int, first_byte: int) -> tuple:
    """(.oov pairs (U, 2), .oovtext bytes) of (ids, spellings) sentences whose first token is the shard's
    `first_token`-th and whose spellings follow `first_byte` bytes of those before."""
    pairs, text, token = [], bytearray(), first_token
    for ids, spellings in sentences:
        for k in sorted(spellings):
            text += spellings[k].encode("utf-8", "surrogatepass")  # read back as written, whatever it is
            pairs.append((token + k, first_byte + len(text)))
        token += len(ids)
    return np.array(pairs, dtype=PAIR).reshape(-1, 2), bytes(text)


def refuse_unspelled(folder: Path, kept: bool, tokenizer) -> None:
    """A ValueError where a word tokenizer's shards keep no spellings (v1, written before they did) and the
    run reads them (kept False): their <UNK> words would reach the character CNN as <UNK>'s characters."""
    if keeps_spellings(tokenizer) and not kept:  # a ValueError, as check_tokenizer's own refusal
        raise ValueError(f"{folder} holds v1 word shards, written before shards kept the spellings of <UNK> "
                         "words: rerun `lmforge corpus shard` into a new --out to rewrite them")


def _mapped(path: Path, dtype, size: int) -> np.ndarray:
    """The file as a read-only array; an empty one where it holds nothing (an empty file cannot be mapped)."""
    return np.memmap(path, dtype=dtype, mode="r").view(np.ndarray) if size else np.zeros(0, dtype)


def spelling_maps(folder: Path, entry: dict) -> tuple:
    """(.oov pairs (U, 2), .oovtext bytes) of the shard `entry` in `folder`, mapped read-only (the shard
    reader maps them once, with its ids: stream.ShardCorpus._shard)."""
    pairs, text = (folder / f"{entry['name']}{suffix}" for suffix in OOV_SUFFIXES)
    return _mapped(pairs, PAIR, entry["oov"]).reshape(-1, 2), _mapped(text, np.uint8, entry["oov_bytes"])


def sentence_spellings(oov: np.ndarray, text: np.ndarray, offsets) -> list:
    """Per sentence of a shard's token `offsets` (each start, then the end), {position in the sentence:
    spelling} of its <UNK> words, read from the shard's mapped .oov pairs and .oovtext bytes."""
    starts = offsets[:-1].tolist()
    out: list = [{} for _ in starts]
    a, b = np.searchsorted(oov[:, 0], [offsets[0], offsets[-1]]).tolist()
    ends = oov[a:b, 1].tolist()
    for position, begin, end in zip(oov[a:b, 0].tolist(), [int(oov[a - 1, 1]) if a else 0, *ends[:-1]], ends):
        s = bisect_right(starts, position) - 1
        out[s][position - starts[s]] = text[begin:end].tobytes().decode("utf-8", "surrogatepass")
    return out
