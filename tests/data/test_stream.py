import tracemalloc

import numpy as np
import pytest

from lmforge.cli import main
from lmforge.data.examples import blocks, nsp_pairs, pack_sentences
from lmforge.data.shards import shard_corpus
from lmforge.data.stream import DocumentView, PackedBlocks, PackedSentences, ShardCorpus, WithWordStarts
from lmforge.data.synthetic import write_corpus
from lmforge.tokenizer import load_tokenizer


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


def test_shuffling_is_deterministic_by_seed_and_epoch(shard_dir):
    corpus = ShardCorpus(shard_dir)
    ids = np.arange(len(corpus))
    first = corpus.order(ids, seed=1, epoch=0)
    assert np.array_equal(first, corpus.order(ids, seed=1, epoch=0)) and sorted(first.tolist()) == ids.tolist()
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
    for cross, sep in ((True, None), (True, 9), (False, None)):
        lazy = PackedSentences(corpus, ids, 2, 3, max_len=40, cross_documents=cross, doc_sep=sep)
        assert [lazy[i] for i in range(len(lazy))] == pack_sentences(docs, 2, 3, 40, cross, sep)
    with pytest.raises(IndexError):
        lazy[len(lazy)]
    tokenizer = load_tokenizer(shard_dir / "tokenizer")
    worded = WithWordStarts(lazy, tokenizer)
    assert worded[0]["word_starts"] == tokenizer.word_starts(lazy[0]["input_ids"])


def test_nsp_over_shards_is_balanced_and_never_pairs_a_document_with_itself(shard_dir):
    corpus = ShardCorpus(shard_dir)
    view = DocumentView(corpus)
    pairs = nsp_pairs(view, 2, 3, max_len=24, seed=0)
    assert len(pairs) > 500 and abs(np.mean([p["pair_label"] for p in pairs]) - 0.5) < 0.06
    assert all(len(p["input_ids"]) <= 24 and len(p["segment_ids"]) == len(p["input_ids"]) for p in pairs)


def test_streaming_an_epoch_keeps_memory_flat(tokenizer_dir, tmp_path):
    write_corpus(tmp_path / "big.txt", 1_500_000, seed=5)
    shard_corpus([tmp_path / "big.txt"], tokenizer_dir, tmp_path / "s", shard_bytes=1 << 19, log=lambda m: None)
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
    assert load_tokenizer(tmp_path / "run" / "final").vocab_size == load_tokenizer(shard_dir / "tokenizer").vocab_size
    nsp = [*args[:4], "nsp", *args[5:8], str(tmp_path / "nsp"), *args[9:]]  # pairs: built over a DocumentView
    assert main(nsp) == 0 and (tmp_path / "nsp" / "final").is_dir()
