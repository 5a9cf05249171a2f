"""pretrain.tokenize_documents batches every tokenizer through the backend's encode_batch, as corpus shard
does: the ids are those of one Tokenizer.encode a sentence, and bad text is refused as encode refuses it."""
import pytest

from lmforge.data.synthetic import corpus_text, documents
from lmforge.tokenizer import train_tokenizer
from lmforge.tokenizer.chars import spelled_ids, train_words
from lmforge.train.pretrain import tokenize_documents

DOCS = [*documents(30, seed=4), ["", "   ", "Ünïcödé wörds, a tab\there and a\nbreak."], []]


@pytest.fixture(scope="module")
def tokenizers():
    lines = corpus_text(300, seed=0).splitlines()
    kinds = ("wordpiece", "bpe", "bytelevel-bpe", "unigram")
    out = {kind: train_tokenizer(lines, kind, 300) for kind in kinds}
    out["words"] = train_words(lines, 60)
    return out


@pytest.mark.parametrize("kind", ["wordpiece", "bpe", "bytelevel-bpe", "unigram", "words"])
def test_the_ids_are_those_of_encoding_each_sentence(tokenizers, kind):
    tok = tokenizers[kind]
    one_by_one = [[ids for ids in (tok.encode(s, add_special_tokens=False).ids for s in doc) if ids]
                  for doc in DOCS]
    batched = tokenize_documents(tok, DOCS)
    assert batched == one_by_one and sum(map(len, batched)) > 60  # empty sentences dropped, as before
    assert all(type(i) is int for doc in batched for ids in doc for i in ids)


def test_spelled_sentences_are_spelled_ids(tokenizers):
    tok = tokenizers["words"]
    spelled = tokenize_documents(tok, DOCS, spelled=True)
    assert [[ids for ids, _ in doc] for doc in spelled] == tokenize_documents(tok, DOCS)
    want = [[spelled_ids(tok, s) for s in doc if tok.encode(s, add_special_tokens=False).ids] for doc in DOCS]
    assert spelled == want and any(spellings for doc in spelled for _, spellings in doc)


@pytest.mark.parametrize("spelled", [False, True])
def test_a_lone_surrogate_is_refused_as_encode_refuses_it(tokenizers, spelled):
    """A JSONL record's "\\ud800" reaches the tokenizer as a lone surrogate: batched, the backend raised a
    TypeError naming no text; one by one, Tokenizer.encode's ValueError."""
    tok, bad = tokenizers["words"], "fine text \ud800 here"
    with pytest.raises(ValueError) as one:
        tok.encode(bad, add_special_tokens=False)
    with pytest.raises(ValueError) as batched:
        tokenize_documents(tok, [["a sentence"], ["ok", bad]], spelled=spelled)
    said = "text is not valid Unicode: surrogates not allowed at position 10"
    assert str(batched.value) == str(one.value) == said
