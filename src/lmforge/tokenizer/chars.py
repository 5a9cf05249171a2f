"""ELMo's inputs: words as byte-level character ids, and the word vocabulary of its softmax.

Characters follow AllenNLP's ELMoCharacterMapper (Peters et al. 2018's released models read
them so): a word is its UTF-8 bytes (0-255) between a begin-of-word (258) and an end-of-word
(259) mark, cut to max_characters - 2 bytes and padded with 260; the sentence tokens <S> and
</S> are one character 256 / 257 between the marks. Every id is then shifted by one so that 0
pads whole words (rows of a batch beyond a sentence's length), hence 262 character ids.

    "hi"  ->  [259, 105, 106, 260, 261, 261, ...]     (50 ids)
    <S>   ->  [259, 257, 260, 261, 261, ...]

The word vocabulary (`train_words`) is a WordLevel `tokenizers` model over the corpus' words
(split at spaces and punctuation), most frequent first, ties in code-point order, so the same
text gives the same ids; <pad>, <S>, </S> and <UNK> take ids 0-3.
"""
from __future__ import annotations

from collections import Counter

import torch
from tokenizers import AddedToken, pre_tokenizers, processors
from tokenizers import Tokenizer as Backend
from tokenizers.models import WordLevel

from lmforge.tokenizer.wrapper import Tokenizer
from lmforge.utils.errors import shown

BOS_CHAR, EOS_CHAR, BOW_CHAR, EOW_CHAR, PAD_CHAR = 256, 257, 258, 259, 260  # before the shift by one
BOS, EOS = "<S>", "</S>"  # the sentence tokens whose characters are BOS_CHAR / EOS_CHAR
WORD_TOKENS = {"pad": "<pad>", "bos": BOS, "eos": EOS, "unk": "<UNK>"}  # ids 0-3, in this order


def word_chars(word: str, max_characters: int = 50) -> list:
    """One word's `max_characters` character ids (AllenNLP's convention, shifted by one)."""
    if word in (BOS, EOS):
        body = [BOS_CHAR if word == BOS else EOS_CHAR]
    else:
        body = list(word.encode("utf-8", "ignore")[: max_characters - 2])
    ids = [BOW_CHAR, *body, EOW_CHAR]
    return [c + 1 for c in ids + [PAD_CHAR] * (max_characters - len(ids))]


def sentence_chars(sentences: list, max_characters: int = 50, boundaries: bool = True) -> tuple:
    """Sentences (lists of words) -> (char ids (B, T, max_characters) long, mask (B, T) bool), right
    padded with all-zero words; boundaries: <S> and </S> around each sentence (T = longest + 2)."""
    rows = [[BOS, *words, EOS] if boundaries else list(words) for words in sentences]
    T = max(len(r) for r in rows)
    chars = torch.zeros(len(rows), T, max_characters, dtype=torch.long)
    for b, row in enumerate(rows):
        chars[b, : len(row)] = torch.tensor([word_chars(w, max_characters) for w in row], dtype=torch.long)
    mask = torch.arange(T)[None] < torch.tensor([len(r) for r in rows])[:, None]
    return chars, mask


def check_sentences(sentences, what: str = "sentences") -> list:
    """`sentences` as a list of non-empty lists of str; ValueError naming the first bad one."""
    if not isinstance(sentences, (list, tuple)) or not sentences:
        raise ValueError(f"{what} must be a non-empty list of sentences (lists of words)")
    for i, words in enumerate(sentences):
        if isinstance(words, str) or not isinstance(words, (list, tuple)) or not words:
            raise ValueError(f"{what}[{i}] must be a non-empty list of words, got {shown(words)}")
        if not all(isinstance(w, str) and w for w in words):
            raise ValueError(f"{what}[{i}] holds a word that is not a non-empty str: {shown(list(words))}")
    return [list(words) for words in sentences]


def vocabulary_chars(tokenizer, max_characters: int = 50) -> list:
    """Per id of a word tokenizer, the characters of its word (all zeros for the pad id)."""
    pad = tokenizer.special_id("pad")
    return [[0] * max_characters if i == pad else word_chars(tokenizer.id_to_token(i), max_characters)
            for i in range(tokenizer.vocab_size)]


def spelled_ids(tokenizer, text: str) -> tuple:
    """(word ids, {position: spelling} of the words read as <UNK>) of one sentence (no marks): the
    biLM's inputs are every word's own characters, its targets the vocabulary's ids (bilm-tf)."""
    enc = tokenizer.encode(text, add_special_tokens=False)
    return enc.ids, unk_spellings(text, enc.ids, enc.offsets, tokenizer.special_id("unk"))


def unk_spellings(text: str, ids: list, offsets: list, unk: int) -> dict:
    """{position: the text's own spelling} of the words an encoding of `text` read as `unk`."""
    return {k: text[a:b] for k, (i, (a, b)) in enumerate(zip(ids, offsets)) if i == unk}


def count_words(texts) -> Counter:
    """How often each word (BERT's split at spaces and punctuation) occurs in `texts`."""
    split = pre_tokenizers.BertPreTokenizer()
    counts: Counter = Counter()
    for text in texts:
        if not isinstance(text, str):
            raise TypeError(f"tokenizer/chars.py: corpus texts must be str, got {type(text).__name__}")
        counts.update(word for word, _ in split.pre_tokenize_str(text))
    return counts


def train_words(texts, vocab_size: int, min_frequency: int = 1) -> Tokenizer:
    """A word-level tokenizer of at most `vocab_size` ids: the specials, then the most frequent words
    seen at least `min_frequency` times; other words read as <UNK>. <S> w_1 .. w_n </S> is its template."""
    if type(vocab_size) is not int or vocab_size <= len(WORD_TOKENS):
        raise ValueError(f"tokenizer/chars.py: vocab_size must be an integer > {len(WORD_TOKENS)}, "
                         f"got {vocab_size!r}")
    counts = count_words(texts)
    specials = list(WORD_TOKENS.values())
    ranked = sorted((w for w, n in counts.items() if n >= min_frequency and w not in specials),
                    key=lambda w: (-counts[w], w))
    if not ranked:
        raise ValueError("tokenizer/chars.py: empty corpus: no words to build a vocabulary from")
    words = specials + ranked[: vocab_size - len(specials)]
    backend = Backend(WordLevel({w: i for i, w in enumerate(words)}, unk_token=WORD_TOKENS["unk"]))
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    backend.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A {EOS}", pair=f"{BOS} $A {EOS} $B:1 {EOS}:1",
        special_tokens=[(BOS, words.index(BOS)), (EOS, words.index(EOS))])
    return Tokenizer(backend, dict(WORD_TOKENS))
