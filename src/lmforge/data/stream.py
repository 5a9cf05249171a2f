"""Streaming over token shards: documents read through np.memmap, never the whole corpus.

`ShardCorpus` gives random access to the documents of a shard directory (global document ids in corpus
order) and their sentences; only small per-document arrays (lengths, ids) are ever built. On top of it,
deterministic by seed:

- `split(valid_fraction, seed)`: disjoint train/validation document ids (a seeded permutation of the ids;
  the same for any number of shards or workers);
- `order(ids, seed, epoch)`: a shuffled document order, and `iter_documents` to stream it;
- adapters with len() and random access by position, which is what the Trainer needs: `DocumentView`
  (documents as lists of sentence id lists, for the list-based example builders; a word tokenizer's shards
  give (ids, spellings) sentences, shard_oov.py), `PackedBlocks` (contiguous causal-LM blocks, as
  `examples.blocks`), `PackedSentences` (RoBERTa FULL-/DOC-SENTENCES, as `examples.pack_sentences`) and
  `PackedPairs` (NSP, SOP and StructBERT pairs, as `examples.nsp_pairs` and friends), whose plans hold a
  few integers per example, not tokens.

What an objective trains on is an `ExampleFormat` (data: packed sentences, blocks or pairs, the
special tokens around them, word starts); `build_examples` makes its examples as lists from
documents in memory and `lazy_examples` the same examples over shards, built on access. The
objectives declare their format (lmforge.objectives.registry); this layer never sees their names.
"""
from __future__ import annotations

import hashlib
from array import array
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lmforge.config.options import checked_argument, checked_seed
from lmforge.data.corpus import is_shard_dir
from lmforge.data.examples import (blocks, nsp_pairs, pack_sentences, pair_from_plan, plan_nsp,
                                   plan_sentence_nsp, plan_sop, plan_sso, sentence_budget, sentence_nsp_pairs,
                                   sop_pairs, sso_pairs)
from lmforge.data.shard_oov import refuse_unspelled, sentence_spellings, spelling_maps
from lmforge.data.shards import OFFSET, SUFFIXES, ShardError, read_manifest, spelled
from lmforge.tokenizer.words import unchecked_word_starts


class ShardCorpus:
    """The documents of a shard directory, each a list of sentences of token ids, read on demand."""

    def __init__(self, path) -> None:
        self.path = Path(path)
        self.manifest = read_manifest(self.path)
        if not self.manifest.get("complete"):
            raise ShardError(f"{path} is unfinished: rerun `lmforge corpus shard` with the same inputs to "
                             f"complete it")
        self.dtype, self.spelled = np.dtype(self.manifest["dtype"]), spelled(self.manifest)
        self.shards = [s for s in self.manifest["shards"] if s["documents"]]
        self.first_doc = np.cumsum([0] + [s["documents"] for s in self.shards])  # (n_shards + 1,)
        self._first = self.first_doc.tolist()
        self._maps: dict = {}

    def __len__(self) -> int:
        return int(self.first_doc[-1])

    @property
    def n_tokens(self) -> int:
        """Tokens in the corpus."""
        return int(sum(s["tokens"] for s in self.shards))

    def tokenizer(self):
        """The tokenizer the ids come from (DIR/tokenizer)."""
        from lmforge.tokenizer import load_tokenizer

        return load_tokenizer(self.path / "tokenizer")

    def check_tokenizer(self, tokenizer) -> None:
        """Raise ValueError unless `tokenizer` is the one the shards were written with."""
        text, recorded = tokenizer.backend.to_str(pretty=True), self.manifest.get("tokenizer")
        if not (isinstance(recorded, dict) and isinstance(recorded.get("sha256"), str)):  # not a traceback
            raise ShardError(f"{self.path / 'manifest.json'} is damaged: \"tokenizer\" lacks the "
                             "tokenizer's sha256")
        if hashlib.sha256(text.encode()).hexdigest() != recorded["sha256"]:
            raise ValueError(f"{self.path} was tokenised with another tokenizer ({self.path / 'tokenizer'})")

    def _shard(self, k: int) -> tuple:
        """(tokens, sentence offsets, document offsets[, .oov pairs, .oovtext]) of shard k: memmaps, once."""
        if k not in self._maps:
            entry, path = self.shards[k], self.path / self.shards[k]["name"]
            # plain ndarray views: a np.memmap's __getitem__ is Python, microseconds a slice
            self._maps[k] = tuple(np.memmap(f"{path}{s}", dtype=d, mode="r").view(np.ndarray)
                                  for s, d in zip(SUFFIXES, (self.dtype, OFFSET, OFFSET)))
            self._maps[k] += spelling_maps(self.path, entry) if self.spelled else ()
        return self._maps[k]

    def spelled_document(self, doc: int) -> list:
        """Document `doc` as (ids, {position: spelling} of its <UNK> words) sentences (spelled shards)."""
        (tokens, _, _, oov, text), offsets = self._locate(doc)  # located once
        return list(zip(_sentences(tokens, offsets), sentence_spellings(oov, text, offsets)))

    def _locate(self, doc: int) -> tuple:
        """(the arrays of document `doc`'s shard: _shard's, the token offsets of its sentences and end)."""
        if not 0 <= doc < len(self):
            raise IndexError(f"document {doc} of {len(self)}")
        k = bisect_right(self._first, doc) - 1  # bisect: per-document calls, a list beats numpy
        maps, local = self._shard(k), doc - self._first[k]
        return maps, np.asarray(maps[1][maps[2][local]:maps[2][local + 1] + 1])

    def bounds(self, doc: int) -> tuple:
        """(token array of the shard, token offsets of the document's sentences and its end)."""
        maps, offsets = self._locate(doc)
        return maps[0], offsets

    def document(self, doc: int) -> list:
        """Document `doc` as a list of sentences, each a list of token ids."""
        return _sentences(*self.bounds(doc))

    def tokens(self, doc: int) -> np.ndarray:
        """The token ids of document `doc`, one flat array (a view of the memmap)."""
        tokens, offsets = self.bounds(doc)
        return tokens[offsets[0]:offsets[-1]]

    def document_lengths(self) -> np.ndarray:
        """Tokens per document, (n_documents,) int64 (read from the indexes only)."""
        out = []
        for k in range(len(self.shards)):
            _, sent, docs, *_ = self._shard(k)
            out.append(np.asarray(sent[docs[1:]]) - np.asarray(sent[docs[:-1]]))
        return np.concatenate(out) if out else np.zeros(0, OFFSET)

    def split(self, valid_fraction: float = 0.05, seed: int = 0) -> tuple:
        """(train ids, validation ids): disjoint, by document, the same for the same seed."""
        seed = checked_seed(seed)
        valid_fraction = checked_argument("valid_fraction", "float", {"low": 0, "high": 1, "open_high": True},
                                          valid_fraction)
        n = len(self)
        n_valid = min(n - 1, max(1, round(valid_fraction * n))) if valid_fraction and n > 1 else 0
        perm = np.random.Generator(np.random.PCG64([seed, 0x5EED])).permutation(n)
        return np.sort(perm[n_valid:]), np.sort(perm[:n_valid])

    @staticmethod
    def order(ids, seed: int, epoch: int = 0) -> np.ndarray:
        """`ids` shuffled by (seed, epoch)."""
        return np.random.Generator(np.random.PCG64([seed, epoch])).permutation(np.asarray(ids))

    def iter_documents(self, ids=None):
        """Documents in the order of `ids` (default: corpus order), one at a time."""
        yield from (self.document(int(doc)) for doc in (range(len(self)) if ids is None else ids))


def _sentences(tokens: np.ndarray, offsets: np.ndarray) -> list:
    """The sentences at token `offsets` (each start, then the end) of a shard's `tokens`, as id lists."""
    flat = tokens[offsets[0]:offsets[-1]].tolist()
    return [flat[a - offsets[0]:b - offsets[0]] for a, b in zip(offsets[:-1], offsets[1:])]


def open_shards(files) -> ShardCorpus | None:
    """A ShardCorpus when `files` is one shard directory (corpus.is_shard_dir), else None (text)."""
    return ShardCorpus(files[0]) if files and len(files) == 1 and is_shard_dir(files[0]) else None


class DocumentView:
    """Documents `ids` as a read-only sequence for the list-based builders; spelled: (ids, spellings)."""

    def __init__(self, corpus: ShardCorpus, ids=None, spelled: bool = False) -> None:
        self.corpus, self.spelled = corpus, spelled and corpus.spelled  # what the format reads, if kept
        self.ids = np.arange(len(corpus)) if ids is None else np.asarray(ids)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> list:
        return (self.corpus.spelled_document if self.spelled else self.corpus.document)(int(self.ids[i]))


class PackedBlocks:
    """Contiguous `block`-token windows over documents `ids` joined by `eos` (as examples.blocks: the last
    tokens, fewer than a block, left out)."""

    def __init__(self, corpus: ShardCorpus, ids, block: int, eos: int | None = None) -> None:
        self.corpus, self.ids, self.block, self.eos = corpus, np.asarray(ids), block, eos
        lengths = corpus.document_lengths()[self.ids] + (eos is not None)
        self.ends = np.cumsum(lengths)  # (n_docs,) stream offset where each document (with eos) ends

    def __len__(self) -> int:
        return int(self.ends[-1]) // self.block if len(self.ends) else 0

    def __getitem__(self, i: int) -> dict:
        if not 0 <= i < len(self):
            raise IndexError(f"block {i} of {len(self)}")
        start, out = i * self.block, []
        j = int(np.searchsorted(self.ends, start, side="right"))
        while len(out) < self.block:
            pos, need = start + len(out) - (int(self.ends[j - 1]) if j else 0), self.block - len(out)
            tokens = self.corpus.tokens(int(self.ids[j]))
            out += tokens[pos:pos + need].tolist()
            if self.eos is not None and pos + need > len(tokens):
                out.append(self.eos)
            j += 1
        return {"input_ids": out}


class PackedSentences:
    """<s> whole sentences </s> up to max_len over documents `ids` (as examples.pack_sentences):
    FULL-SENTENCES (cross_documents, `doc_sep` between documents) or DOC-SENTENCES."""

    def __init__(self, corpus: ShardCorpus, ids, bos: int, eos: int, max_len: int = 128,
                 cross_documents: bool = True, doc_sep: int | None = None) -> None:
        self.corpus, self.bos, self.eos, self.doc_sep = corpus, bos, eos, doc_sep
        self.budget = sentence_budget(max_len)
        # pieces: (document, first token, end token in its shard, separator after); examples: first piece
        self.pieces, self.starts = self._plan(np.asarray(ids), cross_documents)  # (P, 4), (n + 1,)

    def _plan(self, ids: np.ndarray, cross: bool) -> tuple:
        """The greedy packing of pack_sentences, from sentence offsets alone (one pass)."""
        doc_, lo_, hi_, sep_, starts = (array("q") for _ in range(5))
        size, budget = 0, self.budget
        sep = self.doc_sep is not None and cross
        for doc in ids.tolist():
            _, offsets = self.corpus.bounds(doc)
            # a sentence longer than the budget comes as pieces of it, as in pack_sentences
            sentences = zip(offsets[:-1].tolist(), offsets[1:].tolist())
            for lo, end in ((lo, end) for a, end in sentences for lo in range(a, end, budget)):
                hi = min(lo + budget, end)
                if size and size + hi - lo > budget:
                    size = 0
                if size == 0:
                    starts.append(len(doc_))
                if size and doc_[-1] == doc and not sep_[-1]:
                    hi_[-1] = hi  # the next tokens of the same document
                else:
                    for column, value in zip((doc_, lo_, hi_, sep_), (doc, lo, hi, 0)):
                        column.append(value)
                size += hi - lo
            if not cross:
                size = 0
            elif size and sep:
                sep_[-1] = 1
                size += 1
        starts.append(len(doc_))
        pieces = np.stack([np.frombuffer(a, np.int64) for a in (doc_, lo_, hi_, sep_)], axis=1)
        return pieces, np.frombuffer(starts, np.int64)

    def __len__(self) -> int:
        return len(self.starts) - 1

    def __getitem__(self, i: int) -> dict:
        if not 0 <= i < len(self):
            raise IndexError(f"example {i} of {len(self)}")
        out = []
        for doc, lo, hi, sep in self.pieces[self.starts[i]:self.starts[i + 1]].tolist():
            tokens, _ = self.corpus.bounds(doc)
            out += tokens[lo:hi].tolist() + ([self.doc_sep] if sep else [])
        return {"input_ids": [self.bos, *out[:self.budget], self.eos]}


class PackedPairs:
    """Sentence-pair examples over documents `ids` (as examples.nsp_pairs, sop_pairs, sso_pairs for
    the same documents and seed), planned in one pass over sentence offsets, tokens read on access."""

    PLANS = {"nsp": plan_nsp, "sop": plan_sop, "structural": plan_sso, "sentence-nsp": plan_sentence_nsp}

    def __init__(self, corpus: ShardCorpus, ids, pairs: str, cls: int, sep: int, max_len: int = 128,
                 seed: int = 0) -> None:
        self.corpus, self.ids, self.cls, self.sep = corpus, np.asarray(ids), cls, sep
        # (n, 7) int32, examples.PLAN: documents are positions in ids, tokens offsets in them
        self.plan = self.PLANS[pairs](len(self.ids), self._offsets, max_len=max_len, seed=seed)

    def _offsets(self, d: int) -> list:
        _, offsets = self.corpus.bounds(int(self.ids[d]))
        return (offsets - offsets[0]).tolist()

    def _segment(self, d: int, lo: int, hi: int) -> list:
        return self.corpus.tokens(int(self.ids[d]))[lo:hi].tolist()

    def __len__(self) -> int:
        return len(self.plan)

    def __getitem__(self, i: int) -> dict:
        if not 0 <= i < len(self):
            raise IndexError(f"example {i} of {len(self)}")
        return pair_from_plan(self.plan[i].tolist(), self._segment, self.cls, self.sep)


class WithWordStarts:
    """Examples of `dataset` with the word starts whole-word objectives need, computed on access."""

    def __init__(self, dataset, tokenizer) -> None:
        self.dataset, self.tokenizer = dataset, tokenizer

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int) -> dict:
        example = self.dataset[i]
        return {**example, "word_starts": unchecked_word_starts(self.tokenizer, example["input_ids"])}


KINDS = ("sentences", "blocks", "pairs", "custom")
PAIR_BUILDERS = {"nsp": nsp_pairs, "sop": sop_pairs, "structural": sso_pairs,
                 "sentence-nsp": sentence_nsp_pairs}  # the list twins of PLANS


@dataclass(frozen=True)
class ExampleFormat:
    """How an objective's examples are cut from documents: what build_examples and lazy_examples make."""

    kind: str = "sentences"  # RoBERTa's packed sentences, contiguous blocks, sentence pairs, or `build`'s
    # tokenizer roles: sentences and pairs, the first and last token; blocks, the document joiner
    roles: tuple = ("cls", "sep")
    pairs: str = "nsp"  # pairs: the plan (a key of PackedPairs.PLANS)
    cross_documents: bool = True  # sentences: FULL-SENTENCES (crossing documents, a separator between) or not
    word_starts: bool = False  # whole-word objectives: each example carries its word starts
    reserve: int = 0  # tokens of max_len left free (T5 appends </s> to the corrupted input)
    build: Callable | None = None  # custom: (documents, tokenizer, max_len, seed) -> list of examples
    spellings: bool = False  # custom: sentences as (ids, {position: an <UNK> word's spelling}) (ELMo's biLM)
    # blocks: (max_len, the objective's options) -> the raw tokens of a block, in place of max_len -
    # reserve (T5's span corruption takes more than max_len: its corrupted input is what fills max_len)
    length: Callable | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"example kind {self.kind!r} is not one of {', '.join(KINDS)}")
        if (self.kind == "custom") != (self.build is not None):
            raise ValueError("an example format has a `build` function exactly when its kind is 'custom'")
        if self.kind == "pairs" and self.pairs not in PackedPairs.PLANS:
            raise ValueError(f"pairs {self.pairs!r} is not one of {', '.join(PackedPairs.PLANS)}")
        if self.length is not None and self.kind != "blocks":
            raise ValueError("an example format has a `length` function only for blocks")

    def size(self, max_len: int, options: dict | None = None) -> int:
        """Tokens an example holds before an objective of `options` corrupts it, for inputs of max_len."""
        return self.length(max_len, options or {}) if self.length is not None else max_len - self.reserve


def _joiner(tokenizer, roles: tuple) -> int | None:
    """The id joining documents in blocks: that of the first of `roles` the tokenizer has (None: none).
    An id 0 is an id: GPT-2's <|endoftext|>, id 0, joins its documents as WebText's training does."""
    return next((i for i in (tokenizer.special_id(r) for r in roles) if i is not None), None)


def _ends(tokenizer, roles: tuple) -> tuple:
    """The ids of the first and last token of sentence / pair examples; a ValueError naming the role
    the tokenizer lacks (a None id would otherwise surface as a TypeError mid-training)."""
    ids = tuple(tokenizer.special_id(r) for r in roles)
    missing = [r for r, i in zip(roles, ids) if i is None]
    if missing:
        raise ValueError(f"the tokenizer has no {missing[0]!r} token, which this objective's examples are "
                         f"framed with ({' / '.join(roles)}): use a tokenizer of a family that has one "
                         "(e.g. roberta's <s> / </s>, bert's [CLS] / [SEP])")
    return ids


def build_examples(fmt: ExampleFormat, docs, tokenizer, max_len: int, seed: int = 0,
                   options: dict | None = None) -> list:
    """The examples of format `fmt` as a list, from documents of sentence id lists (or a DocumentView);
    `options`: the objective's, which may size them (ExampleFormat.size)."""
    max_len = fmt.size(max_len, options)
    if fmt.kind == "custom":
        return fmt.build(docs, tokenizer, max_len, seed)
    if fmt.kind == "pairs":
        first, last = _ends(tokenizer, fmt.roles)
        examples = PAIR_BUILDERS[fmt.pairs](docs, first, last, max_len=max_len, seed=seed)
    elif fmt.kind == "blocks":
        examples = blocks(docs, max_len, eos=_joiner(tokenizer, fmt.roles))
    else:
        first, last = _ends(tokenizer, fmt.roles)
        # FULL-SENTENCES: "an extra separator token between documents" (RoBERTa, sec. 4.2), the closing one
        examples = pack_sentences(docs, first, last, max_len=max_len, cross_documents=fmt.cross_documents,
                                  doc_sep=last)
    return list(WithWordStarts(examples, tokenizer)) if fmt.word_starts else examples


def lazy_examples(fmt: ExampleFormat, corpus: ShardCorpus, ids, tokenizer, max_len: int, seed: int = 0,
                  options: dict | None = None):
    """The examples build_examples makes for `fmt` over documents `ids` (with `seed`), built on access;
    None for a custom format (its builder takes lists)."""
    max_len = fmt.size(max_len, options)
    if fmt.kind == "custom":
        return None
    if fmt.kind == "pairs":
        examples = PackedPairs(corpus, ids, fmt.pairs, *_ends(tokenizer, fmt.roles), max_len, seed)
    elif fmt.kind == "blocks":
        examples = PackedBlocks(corpus, ids, max_len, eos=_joiner(tokenizer, fmt.roles))
    else:
        first, last = _ends(tokenizer, fmt.roles)
        examples = PackedSentences(corpus, ids, first, last, max_len, cross_documents=fmt.cross_documents,
                                   doc_sep=last)  # as build_examples
    return WithWordStarts(examples, tokenizer) if fmt.word_starts else examples


def shard_examples(fmt: ExampleFormat, corpus: ShardCorpus, tokenizer, max_len: int, seed: int,
                   valid_fraction: float = 0.05, options: dict | None = None) -> tuple:
    """(train, validation) examples of format `fmt` over a shard corpus, split by document: lazy where
    the format allows, else build_examples over a DocumentView (lists)."""
    corpus.check_tokenizer(tokenizer)
    refuse_unspelled(corpus.path, corpus.spelled or not fmt.spellings, tokenizer)  # v1 word shards, for bilm
    train, valid = corpus.split(valid_fraction, seed)
    train = corpus.order(train, seed)  # packing crosses documents: mix the files before it
    out = []
    for ids in (train, valid):
        examples = lazy_examples(fmt, corpus, ids, tokenizer, max_len, seed, options)
        out.append(build_examples(fmt, DocumentView(corpus, ids, fmt.spellings), tokenizer, max_len, seed,
                                  options) if examples is None else examples)
    return tuple(out)
