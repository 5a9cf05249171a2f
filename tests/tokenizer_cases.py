"""Shared by test_tokenizer.py and test_tokenizer_sentencepiece.py: the corpus their reference tokenizers are
trained on, the texts and the sentence pair they are compared on, and the comparison of ids."""

CORPUS = ["The quick brown fox jumps over the lazy dog.", "Héllo wörld, naïve café! Ça va?",
          "Ünïcödé ÀÉÎ text with accents", "tokenization of long words is fun", "numbers 12345 ½ ﬁ"] * 4
TEXTS = ["Héllo wörld! Ça va? naïve café", "emoji 😀🎉 and 👩‍👩‍👧", "supercalifragilistic" * 6,
         "", "  spaced   out  ", "中文 日本語", "The lazy dog."]
PAIR = (TEXTS[0], TEXTS[6])


def assert_same_ids(ours, reference, texts=TEXTS):
    """Identical ids for every text and for a sentence pair (special tokens included)."""
    for text in texts:
        assert ours.encode(text).ids == reference(text)["input_ids"], text
    assert ours.encode(*PAIR).ids == reference(*PAIR)["input_ids"]
