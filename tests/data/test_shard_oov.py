"""A word tokenizer's shards keep their <UNK> words' spellings: read back as text reads them, written the
same by any number of workers, checked on read, and old shards without them refused."""
import json

import pytest

import lmforge.data.shards as shards
from lmforge.data.shard_oov import keeps_spellings
from lmforge.data.shards import ShardError, shard_corpus, verify
from lmforge.data.stream import DocumentView, ExampleFormat, ShardCorpus, shard_examples
from lmforge.objectives import registry
from lmforge.tokenizer import load_tokenizer
from lmforge.tokenizer.chars import train_words
from lmforge.train.pretrain import read_documents, tokenize_documents
from tests.data.shard_cases import interrupt_at


@pytest.fixture
def text(tmp_path):
    """A corpus whose rare words (seen once, some not ASCII) are <UNK> to a 20-word vocabulary."""
    path = tmp_path / "c.txt"
    path.write_text("\n\n".join(f"the cat sat on mat {i} . Zyzzyvä{i} ran. ok" for i in range(200))
                    + "\n\nno unknown word here: the cat\n", encoding="utf-8")
    return path


def _shard(text, out, **kw):
    return shard_corpus([text], train_words([text.read_text()], 20), out, shard_bytes=3000,
                        log=lambda m: None, **kw)


def _files(out):
    return {p.name: p.read_bytes() for p in sorted(out.glob("shard-*"))}


def test_spelled_shards_read_back_as_the_text_does(text, tmp_path):
    manifest = _shard(text, tmp_path / "s")
    assert manifest["version"] == 2 and manifest["spelled"] and len(manifest["shards"]) == 3
    tokenizer = load_tokenizer(tmp_path / "s" / "tokenizer")
    assert keeps_spellings(tokenizer)
    direct = tokenize_documents(tokenizer, read_documents([text]), spelled=True)
    assert list(DocumentView(ShardCorpus(tmp_path / "s"), spelled=True)) == direct
    plain = tokenize_documents(tokenizer, read_documents([text]))  # a format reading no spellings: ids alone
    assert list(DocumentView(ShardCorpus(tmp_path / "s"))) == plain
    assert direct[3][1][1] == {0: "Zyzzyvä3"}  # a word of two-byte characters, spelled whole
    unknown = sum(ids.count(tokenizer.special_id("unk")) for doc in direct for ids, _ in doc)
    assert sum(s["oov"] for s in manifest["shards"]) == unknown >= 200
    assert verify(tmp_path / "s") == []


def test_each_file_of_a_spelled_shard_is_mapped_once_in_the_one_cache(text, tmp_path, monkeypatch):
    """ids and spellings share ShardCorpus._shard's cache: every file of a shard is mapped once however
    often its documents are read, and a spelled document is located once (bisect over the shards)."""
    import lmforge.data.stream as stream

    _shard(text, tmp_path / "s")
    corpus = ShardCorpus(tmp_path / "s")
    mapped, located = [], []
    real_memmap, real_bisect = stream.np.memmap, stream.bisect_right
    # numpy's own memmap, which both the ids and the spellings are mapped by
    def memmap(path, **kw):
        mapped.append(str(path))
        return real_memmap(path, **kw)

    monkeypatch.setattr(stream.np, "memmap", memmap)
    monkeypatch.setattr(stream, "bisect_right", lambda *a: located.append(a) or real_bisect(*a))
    first = corpus.spelled_document(0)
    assert len(located) == 1
    for _ in range(2):
        views = [corpus.spelled_document(d) for d in range(len(corpus))]
    assert views[0] == first and len(mapped) == len(set(mapped)) <= 5 * len(corpus.shards)
    assert {p.rsplit(".", 1)[1] for p in mapped} == {"bin", "sent", "docs", "oov", "oovtext"}
    assert sorted(corpus._maps) == list(range(len(corpus.shards)))  # one entry a shard: its five arrays


def test_any_number_of_workers_and_a_resume_write_the_same_bytes(text, tmp_path, monkeypatch):
    _shard(text, tmp_path / "1")
    _shard(text, tmp_path / "2", workers=2)
    assert _files(tmp_path / "1") == _files(tmp_path / "2")
    real = shards.write_shard
    interrupt_at(monkeypatch, "shard-00002")
    with pytest.raises(KeyboardInterrupt):
        _shard(text, tmp_path / "r")
    monkeypatch.setattr(shards, "write_shard", real)
    _shard(text, tmp_path / "r")
    assert _files(tmp_path / "r") == _files(tmp_path / "1") and not list((tmp_path / "r").glob("*.tmp"))


@pytest.mark.parametrize("damage", ["cut", "changed"])
def test_a_damaged_spelling_file_is_refused_on_read_and_redone_on_rerun(text, tmp_path, damage):
    _shard(text, tmp_path / "s")
    path = tmp_path / "s" / "shard-00001.oovtext"
    data = path.read_bytes()
    path.write_bytes(data[:-1] if damage == "cut" else data[:-1] + b"X")
    shards._VERIFIED.clear()
    with pytest.raises(ShardError, match="shard-00001.oovtext"):
        ShardCorpus(tmp_path / "s")
    assert verify(tmp_path / "s") == ["shard-00001"]
    _shard(text, tmp_path / "s")  # the rerun redoes it
    assert path.read_bytes() == data


def test_old_word_shards_without_spellings_are_refused_in_one_line(text, tmp_path):
    _shard(text, tmp_path / "s")
    manifest_path = tmp_path / "s" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    del manifest["spelled"]  # as v1 wrote them: ids alone
    manifest["version"] = 1
    for entry in manifest["shards"]:
        entry.pop("oov"), entry.pop("oov_bytes"), entry["sha256"].pop("oov"), entry["sha256"].pop("oovtext")
    manifest_path.write_text(json.dumps(manifest))
    corpus = ShardCorpus(tmp_path / "s")
    with pytest.raises(ValueError, match="v1 word shards, written before shards kept the spellings"):
        shard_examples(registry.get("bilm").examples, corpus, corpus.tokenizer(), 16, 0)
    causal = ExampleFormat("blocks", roles=("eos",))  # a format that reads no spellings: not refused
    train, held = shard_examples(causal, corpus, corpus.tokenizer(), 16, 0)
    assert len(train) and len(held)
    with pytest.raises(ValueError, match="v1 word shards") as refused:
        _shard(text, tmp_path / "s")
    assert "\n" not in str(refused.value)


def test_subword_shards_stay_v1_without_spelling_files(corpus_dir, tokenizer_dir, tmp_path):
    manifest = shard_corpus([corpus_dir / "c.txt"], tokenizer_dir, tmp_path / "s", log=lambda m: None)
    assert manifest["version"] == 1 and "spelled" not in manifest and not keeps_spellings(
        load_tokenizer(tokenizer_dir))
    assert sorted(manifest["shards"][0]["sha256"]) == ["bin", "docs", "sent"]
    assert not list((tmp_path / "s").glob("*.oov*"))
    corpus = ShardCorpus(tmp_path / "s")
    assert DocumentView(corpus)[0] == corpus.document(0)


def test_a_sentence_is_read_alike_as_ids_or_as_ids_and_spellings():
    """sentence_parts: the one reading of a sentence's two forms (a subword tokenizer's id list, a word
    tokenizer's (ids, spellings)), so no reader tells them apart its own way."""
    from lmforge.data.shard_oov import sentence_parts

    assert sentence_parts([4, 5]) == ([4, 5], None)
    assert sentence_parts(([4, 1], {1: "Zyzzyvä"})) == ([4, 1], {1: "Zyzzyvä"})
    assert sentence_parts(([], {})) == ([], {}) and sentence_parts([]) == ([], None)  # empty: dropped alike
