"""The biLM's inputs and targets: a word out of the vocabulary is read by its own characters and predicted as
<UNK> (bilm-tf, AllenNLP); in-vocabulary words and unspelled examples are as before."""
import pytest
import torch

import lmforge
from lmforge.objectives.bilm import BiLM, sentence_examples
from lmforge.tokenizer.chars import spelled_ids, train_words, word_chars

CORPUS = ["the cat sat .", "the cat sat .", "a zyzzyva ."]


@pytest.fixture
def setup():
    tokenizer = train_words(CORPUS, vocab_size=8)  # "a" and "zyzzyva" (seen once) are out of the vocabulary
    torch.manual_seed(0)
    model = lmforge.build("elmo-small", lstm_dim=16, d_model=8, char_filters=[[1, 4], [2, 4]],
                          char_embed_dim=4, vocab_size=8, dropout=0.0)
    return tokenizer, BiLM.build(model, tokenizer)


def test_an_oov_word_is_fed_its_own_characters_and_its_target_stays_unk(setup):
    tokenizer, objective = setup
    unk = tokenizer.special_id("unk")
    spelled = spelled_ids(tokenizer, "the zyzzyva sat")
    assert spelled[1] == {1: "zyzzyva"} and spelled[0][1] == unk
    batch = objective.collate(sentence_examples([[spelled]], tokenizer, 24))
    assert batch["char_ids"][0, 2].tolist() == word_chars("zyzzyva") != word_chars("<UNK>")
    assert batch["input_ids"][0, 2] == unk  # the loss's targets: the vocabulary's ids
    plain = objective.collate(sentence_examples([[spelled[0]]], tokenizer, 24))
    assert torch.equal(plain["input_ids"], batch["input_ids"])
    assert plain["char_ids"][0, 2].tolist() == word_chars("<UNK>")  # unspelled: the id's characters
    keep = [k for k in range(batch["char_ids"].shape[1]) if k != 2]  # in-vocabulary words and marks unchanged
    assert torch.equal(batch["char_ids"][:, keep], plain["char_ids"][:, keep])
    with torch.no_grad():
        assert float(objective(batch).loss) != float(objective(plain).loss)


def test_spellings_follow_their_piece_of_a_cut_sentence(setup):
    tokenizer, _ = setup
    ids, spellings = spelled_ids(tokenizer, "the cat qux sat the quux")
    assert spellings == {2: "qux", 5: "quux"}
    pieces = sentence_examples([[(ids, spellings)]], tokenizer, 5)  # 3 words a piece, between <S> and </S>
    assert [p.get("oov") for p in pieces] == [{3: "qux"}, {3: "quux"}]
    unspelled = sentence_examples([[ids]], tokenizer, 5)
    assert [p["input_ids"] for p in pieces] == [e["input_ids"] for e in unspelled]


def test_a_spelling_of_a_word_that_is_not_unk_is_refused(setup):
    tokenizer, objective = setup
    ids = tokenizer.encode("the cat", add_special_tokens=False).ids
    for oov in ({1: "dog"}, {9: "dog"}, {1: ""}):  # an in-vocabulary word, past the example, empty
        example = sentence_examples([[ids]], tokenizer, 24)[0]
        with pytest.raises(ValueError, match="not one of its <UNK> words"):
            objective.collate([{**example, "oov": oov}])
