"""The word tokenizer's spelled encoding: the ids of a sentence, and the words its <UNK>s stand for."""
from lmforge.tokenizer.chars import spelled_ids, train_words


def test_spelled_ids_are_the_ids_and_the_spelling_of_each_unk():
    tokenizer = train_words(["the cat sat .", "the cat sat ."], vocab_size=8)
    text = "the Zürich-cat sat"
    ids, spellings = spelled_ids(tokenizer, text)
    assert ids == tokenizer.encode(text, add_special_tokens=False).ids
    unk = tokenizer.special_id("unk")
    words = ["the", "Zürich", "-", "cat", "sat"]
    assert spellings == {k: w for k, (i, w) in enumerate(zip(ids, words)) if i == unk}
    assert spellings == {1: "Zürich", 2: "-"}
    known = tokenizer.encode("the cat sat", add_special_tokens=False).ids
    assert spelled_ids(tokenizer, "the cat sat") == (known, {})  # in-vocabulary words: no spellings
