"""The inverse cloze task: the pseudo-question is one of the passage's sentences, taken out of its
context (or left in with probability keep), drawn with the seed; passages of one sentence give none."""
from __future__ import annotations

import random

import pytest

from lmforge.retrieval.dpr import BiEncoder, EncoderOptions
from lmforge.retrieval.ict import ict_examples, ict_pair, sentences
from lmforge.retrieval.passages import Passage, load_passages
from lmforge.tokenizer.train import train_tokenizer

TEXT = "Mupi lies on the Rhine river. It is a city in Klirefaim. Nobody was born there!"


def test_sentences_split_after_end_marks():
    assert sentences(TEXT) == ["Mupi lies on the Rhine river.", "It is a city in Klirefaim.",
                               "Nobody was born there!"]


def test_the_pseudo_question_is_taken_out_of_its_context():
    rng = random.Random(0)
    for _ in range(20):
        question, context = ict_pair("Mupi", TEXT, rng, keep=0.0)
        assert question in sentences(TEXT) and question not in context and context.startswith("Mupi. ")
    question, context = ict_pair("Mupi", TEXT, random.Random(1), keep=1.0)
    assert question in context
    assert ict_pair("t", "One sentence only.", rng) is None


@pytest.fixture(scope="module")
def encoder():
    import lmforge

    passages = load_passages(None)[:20]
    tok = train_tokenizer([p.text for p in passages], "wordpiece", 200)
    model = lmforge.build("bert-base", n_layers=1, d_model=16, n_heads=2, d_ff=32, vocab_size=tok.vocab_size,
                          max_seq_len=64)
    return BiEncoder(model, tok, EncoderOptions(max_length=64)), passages


def test_examples_are_seeded_and_skip_single_sentence_passages(encoder):
    enc, passages = encoder
    one = [Passage("x", "t", "Just one.")]
    first = ict_examples(enc, passages + one, seed=3, rounds=2)
    assert first == ict_examples(enc, passages + one, seed=3, rounds=2)
    assert first != ict_examples(enc, passages + one, seed=4, rounds=2)
    assert len(first) == 2 * len(passages) and all(e["negatives"] == [] for e in first)
    with pytest.raises(ValueError, match="two sentences"):
        ict_examples(enc, one)


def test_another_rounds_context_of_the_same_passage_is_no_in_batch_negative(encoder):
    from lmforge.retrieval.dpr import DPRObjective

    enc, passages = encoder
    examples = ict_examples(enc, passages[:3], seed=0, keep=0.0, rounds=2)  # rows 0-2, then 0-2 again
    same = DPRObjective(enc).collate(examples)["same_passage"]
    source = [i % 3 for i in range(len(examples))]
    want = [[i != j and source[i] == source[j] for j in range(len(examples))] for i in range(len(examples))]
    # each context holds the other round's pseudo-question: masked, not a negative
    assert same.tolist() == want
