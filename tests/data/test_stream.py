import json
import tracemalloc

import numpy as np
import pytest

from lmforge.cli import main
from lmforge.data.examples import PLAN, blocks, nsp_pairs, pack_sentences, sso_pairs
from lmforge.data.shards import FORMAT, VERSION, ShardWriter, shard_corpus
from lmforge.data.stream import (PAIR_BUILDERS, DocumentView, ExampleFormat, PackedBlocks, PackedPairs,
                                 PackedSentences, ShardCorpus, WithWordStarts, build_examples, lazy_examples,
                                 shard_examples)
from lmforge.data.synthetic import write_corpus
from lmforge.tokenizer import load_tokenizer
from tests.data.test_examples import CLS, SEP, _docs

BUILDERS = PAIR_BUILDERS


@pytest.fixture(scope="module")
def shard_dir(corpus_dir, tokenizer_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("shards")
    shard_corpus([corpus_dir / "a.txt", corpus_dir / "b.jsonl.gz", corpus_dir / "c.txt"], tokenizer_dir, out,
                 shard_bytes=20_000, log=lambda m: None)
    return out


def test_split_is_by_document_disjoint_and_seeded(shard_dir):
    corpus = ShardCorpus(shard_dir)
    train, valid = corpus.split(0.1, seed=3)
    assert len(valid) == round(0.1 * len(corpus)) and len(train) + len(valid) == len(corpus)
    assert not set(train.tolist()) & set(valid.tolist())
    assert np.array_equal(corpus.split(0.1, seed=3)[1], valid)
    assert not np.array_equal(corpus.split(0.1, seed=4)[1], valid)


@pytest.mark.parametrize("given, said", [
    ({"seed": -1}, "seed must be an integer >= 0"), ({"seed": 1.5}, "seed must be an integer"),
    ({"valid_fraction": "0.1"}, "valid_fraction must be a number"),
    ({"valid_fraction": 1}, "valid_fraction must be a finite number >= 0 and < 1")])
def test_split_refuses_a_bad_seed_or_fraction_naming_it(shard_dir, given, said):
    """A seed of -1 was numpy's "expected non-negative integer" (no name), a text fraction a TypeError."""
    from lmforge.config.options import OptionsError

    with pytest.raises(OptionsError, match=f"^{said}") as refused:
        ShardCorpus(shard_dir).split(**{"valid_fraction": 0.1, **given})
    assert refused.value.field == next(iter(given))


def test_shuffling_is_deterministic_by_seed_and_epoch(shard_dir):
    corpus = ShardCorpus(shard_dir)
    ids = np.arange(len(corpus))
    first = corpus.order(ids, seed=1, epoch=0)
    assert np.array_equal(first, corpus.order(ids, seed=1, epoch=0)) and \
        sorted(first.tolist()) == ids.tolist()
    assert not np.array_equal(first, corpus.order(ids, seed=1, epoch=1))
    assert not np.array_equal(first, corpus.order(ids, seed=2, epoch=0))
    streamed = list(corpus.iter_documents(first[:5]))
    assert streamed == [corpus.document(int(d)) for d in first[:5]]


def test_lazy_adapters_equal_the_list_builders(shard_dir):
    corpus = ShardCorpus(shard_dir)
    ids = corpus.order(np.arange(len(corpus)), seed=0)[:300]
    docs = [corpus.document(int(d)) for d in ids]
    lazy = PackedBlocks(corpus, ids, 32, eos=3)
    assert [lazy[i] for i in range(len(lazy))] == blocks(docs, 32, eos=3)
    assert len(PackedBlocks(corpus, ids, 32)) == len(blocks(docs, 32))
    for cross, sep, max_len in ((True, None, 40), (True, 9, 40), (False, None, 40), (True, None, 6),
                                (False, 9, 5)):  # max_len 5 and 6: most sentences come in pieces
        lazy = PackedSentences(corpus, ids, 2, 3, max_len=max_len, cross_documents=cross, doc_sep=sep)
        assert [lazy[i] for i in range(len(lazy))] == pack_sentences(docs, 2, 3, max_len, cross, sep)
        assert sum(len(lazy[i]["input_ids"]) - 2 for i in range(len(lazy))) >= sum(map(len, map(
            corpus.tokens, ids)))  # no token lost (separators on top)
    with pytest.raises(IndexError):
        lazy[len(lazy)]
    tokenizer = load_tokenizer(shard_dir / "tokenizer")
    worded = WithWordStarts(lazy, tokenizer)
    assert worded[0]["word_starts"] == tokenizer.word_starts(lazy[0]["input_ids"])


FORMATS = [ExampleFormat(), ExampleFormat(word_starts=True), ExampleFormat(cross_documents=False),
           ExampleFormat("blocks", roles=("eos", "sep")), ExampleFormat("blocks", roles=("sep",), reserve=1),
           ExampleFormat("pairs", pairs="sop")]


@pytest.mark.parametrize("fmt", FORMATS,
                         ids=lambda f: f"{f.kind}-{f.roles}-{f.word_starts}-{f.cross_documents}")
def test_every_format_is_the_same_lazy_or_listed(shard_dir, fmt):
    corpus, tokenizer = ShardCorpus(shard_dir), load_tokenizer(shard_dir / "tokenizer")
    ids = corpus.order(np.arange(len(corpus)), seed=0)[:200]
    listed = build_examples(fmt, [corpus.document(int(d)) for d in ids], tokenizer, 40, seed=3)
    lazy = lazy_examples(fmt, corpus, ids, tokenizer, 40, seed=3)
    assert len(listed) > 20 and [lazy[i] for i in range(len(lazy))] == listed
    assert all(len(e["input_ids"]) <= 40 - fmt.reserve for e in listed)
    assert all(("word_starts" in e) == fmt.word_starts for e in listed)


def test_bounds_are_the_shard_tokens_and_the_document_offsets(shard_dir):
    corpus = ShardCorpus(shard_dir)
    for doc in (0, len(corpus) // 2, len(corpus) - 1):
        tokens, offsets = corpus.bounds(doc)  # nothing more: the spelled reader locates its arrays itself
        sentences = corpus.document(doc)
        flat = [i for sentence in sentences for i in sentence]
        assert len(offsets) == len(sentences) + 1 and tokens[offsets[0]:offsets[-1]].tolist() == flat
        assert corpus.tokens(doc).tolist() == flat
    with pytest.raises(IndexError, match=f"document {len(corpus)} of {len(corpus)}"):
        corpus.bounds(len(corpus))


def test_examples_word_starts_skip_the_check_of_ids_they_built(shard_dir, monkeypatch):
    """The examples' ids are Python ints by construction: their word starts are the public word_starts's,
    without its check of every id (two Python passes an example); the public method still checks."""
    from lmforge.tokenizer import words

    corpus, tokenizer = ShardCorpus(shard_dir), load_tokenizer(shard_dir / "tokenizer")
    ids = corpus.order(np.arange(len(corpus)), seed=0)[:100]
    plain = build_examples(ExampleFormat(), [corpus.document(int(d)) for d in ids], tokenizer, 40)
    want = [tokenizer.word_starts(e["input_ids"]) for e in plain]
    checked, check = [], words.token_ids
    monkeypatch.setattr(words, "token_ids", lambda ids, job: checked.append(job) or check(ids, job))
    fmt = ExampleFormat(word_starts=True)
    listed = build_examples(fmt, [corpus.document(int(d)) for d in ids], tokenizer, 40)
    lazy = lazy_examples(fmt, corpus, ids, tokenizer, 40)
    assert [e["word_starts"] for e in listed] == want == [lazy[i]["word_starts"] for i in range(len(lazy))]
    assert checked == [] and [{**e, "word_starts": s} for e, s in zip(plain, want)] == listed
    with pytest.raises(ValueError, match="word_starts takes one sequence of token ids"):
        tokenizer.word_starts([-1])
    assert checked == ["word_starts"]


def test_a_custom_format_is_built_from_lists_over_shards(shard_dir):
    def first_sentences(docs, tokenizer, max_len, seed):
        return [{"input_ids": doc[0][:max_len]} for doc in docs]

    corpus, tokenizer = ShardCorpus(shard_dir), load_tokenizer(shard_dir / "tokenizer")
    custom = ExampleFormat("custom", build=first_sentences)
    train, valid = shard_examples(custom, corpus, tokenizer, 16, 0, valid_fraction=0.2)
    assert len(train) + len(valid) == len(corpus) and train[0] == {"input_ids": corpus.document(
        int(corpus.order(corpus.split(0.2, 0)[0], 0)[0]))[0][:16]}
    with pytest.raises(ValueError, match="kind 'packed' is not one of"):
        ExampleFormat("packed")
    with pytest.raises(ValueError, match="exactly when its kind is 'custom'"):
        ExampleFormat("custom")


def test_nsp_over_shards_is_balanced_and_never_pairs_a_document_with_itself(shard_dir):
    corpus = ShardCorpus(shard_dir)
    view = DocumentView(corpus)
    pairs = nsp_pairs(view, 2, 3, max_len=24, seed=0)
    assert len(pairs) > 500 and abs(np.mean([p["pair_label"] for p in pairs]) - 0.5) < 0.06
    assert all(len(p["input_ids"]) <= 24 and len(p["segment_ids"]) == len(p["input_ids"]) for p in pairs)


def token_shards(path, docs, per_shard):
    """A shard directory of documents already tokenised (uint32 ids), `per_shard` documents a shard."""
    path.mkdir()
    shards = []
    for k in range(0, len(docs), per_shard):
        writer = ShardWriter(path, f"shard-{k // per_shard:05d}", np.dtype("<u4"))
        writer.add(docs[k:k + per_shard])
        shards.append({"name": f"shard-{k // per_shard:05d}", **writer.close()})
    manifest = {"format": FORMAT, "version": VERSION, "dtype": "uint32", "shards": shards, "complete": True}
    (path / "manifest.json").write_text(json.dumps(manifest))
    return ShardCorpus(path)


@pytest.mark.parametrize("objective", ["nsp", "sop", "structural", "sentence-nsp"])
def test_lazy_pairs_equal_the_list_builders(shard_dir, objective):
    corpus = ShardCorpus(shard_dir)
    ids = corpus.order(np.arange(len(corpus)), seed=0)[:300]
    docs = [corpus.document(int(d)) for d in ids]
    for max_len, seed in ((24, 0), (64, 5)):
        lazy = PackedPairs(corpus, ids, objective, CLS, SEP, max_len=max_len, seed=seed)
        assert len(lazy) > 50 and [lazy[i] for i in range(len(lazy))] == BUILDERS[objective](
            docs, CLS, SEP, max_len=max_len, seed=seed)
    with pytest.raises(IndexError):
        lazy[len(lazy)]


def test_lazy_nsp_over_shards_is_half_is_next_and_small(tmp_path):
    docs = _docs(7000)  # document d's tokens are 1000 * (d + 1) + ...: every token's origin is known
    corpus = token_shards(tmp_path / "s", docs, 900)
    ids = corpus.order(np.arange(len(corpus)), seed=2)
    tracemalloc.start()
    lazy = PackedPairs(corpus, ids, "nsp", CLS, SEP, max_len=32, seed=1)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    # the plan is 7 int32 per example; planning holds little more (no token lists)
    assert lazy.plan.shape == (len(lazy), len(PLAN)) and lazy.plan.nbytes / len(lazy) == 28
    assert len(lazy) >= 10_000 and peak < 64 * len(lazy)
    pairs = [lazy[i] for i in range(len(lazy))]
    assert pairs == nsp_pairs([docs[d] for d in ids], CLS, SEP, max_len=32, seed=1)
    assert abs(np.mean([p["pair_label"] == 0 for p in pairs]) - 0.5) < 0.02
    for p in pairs:
        ids_, seg = p["input_ids"], p["segment_ids"]
        assert len(ids_) <= 32 and ids_[0] == CLS and ids_[-1] == SEP
        first_sep = ids_.index(SEP)
        a, b = ids_[1:first_sep], ids_[first_sep + 1:-1]
        assert a and b and seg == [0] * (len(a) + 2) + [1] * (len(b) + 1)
        origins = {t // 1000 for t in a}, {t // 1000 for t in b}
        assert all(len(o) == 1 for o in origins) and (origins[0] == origins[1]) == (p["pair_label"] == 0)


def test_lazy_sop_and_structural_over_shards(tmp_path):
    docs = _docs(4000, seed=3)
    corpus = token_shards(tmp_path / "s", docs, 1500)
    sop = PackedPairs(corpus, np.arange(len(corpus)), "sop", CLS, SEP, max_len=48, seed=1)
    assert sop.plan.tolist() == \
        PackedPairs(corpus, np.arange(len(corpus)), "sop", CLS, SEP, 48, 1).plan.tolist()
    assert abs(sop.plan[:, -1].mean() - 0.5) < 0.03
    sso = PackedPairs(corpus, np.arange(len(corpus)), "structural", CLS, SEP, max_len=32, seed=1)
    assert [sso[i] for i in range(len(sso))] == sso_pairs(docs, CLS, SEP, max_len=32, seed=1)
    labels = np.bincount(sso.plan[:, -1], minlength=3) / len(sso)
    assert len(sso) > 5000 and np.all(np.abs(labels - 1 / 3) < 0.03)
    for p in (sso[i] for i in range(len(sso))):
        cut = p["input_ids"].index(SEP)
        s1, s2 = p["input_ids"][1:cut], p["input_ids"][cut + 1:-1]
        assert len(p["input_ids"]) <= 32 and (s1[0] // 1000 == s2[0] // 1000) == (p["pair_label"] != 2)
        if p["pair_label"] < 2:  # same document: S2 follows S1 (0) or precedes it (1)
            assert (s1[-1] < s2[0]) == (p["pair_label"] == 0)


def test_pair_objectives_over_shards_are_lazy_and_split_by_document(shard_dir):
    corpus = ShardCorpus(shard_dir)
    tokenizer = load_tokenizer(shard_dir / "tokenizer")
    structural = ExampleFormat("pairs", pairs="structural")
    train, valid = shard_examples(structural, corpus, tokenizer, 40, 7, valid_fraction=0.2)
    assert isinstance(train, PackedPairs) and isinstance(valid, PackedPairs) and len(valid) > 0
    used = [set(part.ids[part.plan[:, [0, 3]].ravel()].tolist()) for part in (train, valid)]
    assert not used[0] & used[1] and set(corpus.split(0.2, 7)[1].tolist()) >= used[1]
    again = shard_examples(structural, corpus, tokenizer, 40, 7, valid_fraction=0.2)[0]
    assert np.array_equal(again.plan, train.plan) and again[0] == train[0]


def test_streaming_an_epoch_keeps_memory_flat(tokenizer_dir, tmp_path):
    write_corpus(tmp_path / "big.txt", 1_500_000, seed=5)
    shard_corpus([tmp_path / "big.txt"], tokenizer_dir, tmp_path / "s", shard_bytes=1 << 19,
                 log=lambda m: None)
    corpus = ShardCorpus(tmp_path / "s")
    order = corpus.order(np.arange(len(corpus)), seed=0)
    samples = []
    tracemalloc.start()
    for i, doc in enumerate(corpus.iter_documents(order)):
        if i % 2000 == 0:
            samples.append(tracemalloc.get_traced_memory()[0])
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    size = sum(p.stat().st_size for p in (tmp_path / "s").glob("shard-*"))
    assert size > 700_000 and len(samples) > 4
    # nothing accumulates over the epoch, and the peak is a small fraction of the shards
    assert max(samples) - samples[1] < 64_000 and peak < size / 10


def test_pretrain_takes_a_shard_directory(shard_dir, tmp_path):
    args = ["pretrain", "--preset", "bert-tiny", "--objective", "mlm", "--data", str(shard_dir), "--out",
            str(tmp_path / "run"), "--steps", "2", "batch_size=2", "progress=false", "n_layers=1",
            "d_model=32", "n_heads=2", "d_ff=64", "max_seq_len=64"]
    assert main(args) == 0
    assert load_tokenizer(tmp_path / "run" / "final").vocab_size == \
        load_tokenizer(shard_dir / "tokenizer").vocab_size
    nsp = [*args[:4], "nsp", *args[5:8], str(tmp_path / "nsp"), *args[9:]]  # pairs: planned, read on access
    assert main(nsp) == 0 and (tmp_path / "nsp" / "final").is_dir()


@pytest.mark.parametrize("fmt", [
    ExampleFormat(roles=("bos", "eos")),
    ExampleFormat("pairs", roles=("bos", "eos")),
], ids=["sentences", "pairs"])
def test_a_tokenizer_without_the_framing_tokens_is_refused_by_name(shard_dir, fmt):
    # a BERT-family tokenizer has no <s> / </s>: BART's sentence examples cannot be framed with it
    corpus, tokenizer = ShardCorpus(shard_dir), load_tokenizer(shard_dir / "tokenizer")
    assert tokenizer.special_id("bos") is None
    docs = [corpus.document(0), corpus.document(1)]
    with pytest.raises(ValueError, match="no 'bos' token"):
        build_examples(fmt, docs, tokenizer, 40)
    with pytest.raises(ValueError, match="no 'bos' token"):
        lazy_examples(fmt, corpus, np.arange(2), tokenizer, 40)


class _EndOfTextZero:
    """GPT-2's specials as lmforge trains them: <|endoftext|> is id 0 and plays bos and eos."""

    def special_id(self, role):
        return {"bos": 0, "eos": 0}.get(role)


def test_blocks_join_documents_with_an_eos_of_id_zero():
    # GPT-2 joins WebText's documents with <|endoftext|>; its id 0 once fell through to "no joiner"
    docs = [[[5, 6, 7]], [[8, 9]], [[10, 11, 12, 13]]]
    examples = build_examples(ExampleFormat("blocks", roles=("eos", "sep")), docs, _EndOfTextZero(), 4)
    stream = [t for e in examples for t in e["input_ids"]]
    assert stream == [5, 6, 7, 0, 8, 9, 0, 10, 11, 12, 13, 0]


def test_full_sentences_put_a_separator_between_documents(shard_dir):
    # RoBERTa's FULL-SENTENCES: "add an extra separator token between documents" (sec. 4.2), listed or lazy
    corpus, tokenizer = ShardCorpus(shard_dir), load_tokenizer(shard_dir / "tokenizer")
    sep, ids = tokenizer.special_id("sep"), np.arange(6)
    docs = [corpus.document(int(i)) for i in ids]
    listed = build_examples(ExampleFormat(), docs, tokenizer, 10_000)
    lazy = lazy_examples(ExampleFormat(), corpus, ids, tokenizer, 10_000)
    assert len(listed) == len(lazy) == 1 and lazy[0] == listed[0]
    assert not any(t == sep for d in docs for s in d for t in s)
    # one after each document (the last one's stands before the closing [SEP], as a block of RoBERTa's stream)
    assert listed[0]["input_ids"][1:-1].count(sep) == len(docs)
    doc_sentences = build_examples(ExampleFormat(cross_documents=False), docs, tokenizer, 10_000)
    assert all(e["input_ids"][1:-1].count(sep) == 0 for e in doc_sentences)


def test_a_block_length_function_sets_the_raw_block_and_only_for_blocks():
    fmt = ExampleFormat("blocks", roles=(), length=lambda max_len, options: max_len + options.get("more", 5))
    examples = build_examples(fmt, [[list(range(10, 60))]], _EndOfTextZero(), 10)
    assert fmt.size(10) == 15 and [len(e["input_ids"]) for e in examples] == [15, 15, 15]
    assert fmt.size(10, {"more": 2}) == 12  # the objective's options size the block
    with pytest.raises(ValueError, match="only for blocks"):
        ExampleFormat("sentences", length=len)
