"""Salient span masking: names and dates are found (function words dropped), every occurrence of the
chosen span is masked with its original ids as labels, and examples record their source passage."""
from __future__ import annotations

import pytest

from lmforge.objectives.base import IGNORE
from lmforge.retrieval.passages import Passage
from lmforge.retrieval.salient import mask_span, salient_spans, span_examples
from lmforge.tokenizer.train import train_tokenizer

TEXT = ("Migom Koudand was born in Mupi in 1935. Mupi is a city in Klirefaim. She met The Beatles on "
        "May 5, 1961.")


def _texts(text, spans):
    return [text[a:b] for a, b in spans]


def test_names_and_dates_are_salient_and_function_words_are_not():
    assert _texts(TEXT, salient_spans(TEXT)) == ["Migom Koudand", "Mupi", "1935", "Mupi", "Klirefaim",
                                                 "Beatles", "May 5, 1961"]


def test_spans_never_overlap():
    text = "In June 1990 Paris met Rome."
    spans = salient_spans(text)
    assert _texts(text, spans) == ["June 1990", "Paris", "Rome"]  # "June" is part of the date only
    assert all(b <= c for (_, b), (c, _) in zip(spans, spans[1:]))


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer([TEXT] * 4, "wordpiece", 120)


def test_every_occurrence_of_the_span_is_masked_and_labelled(tokenizer):
    encoding = tokenizer.encode(TEXT, add_special_tokens=False)
    span = salient_spans(TEXT)[1]  # the first "Mupi"
    mask_id = tokenizer.special_id("mask")
    out = mask_span(encoding, TEXT, span, mask_id, 200)
    masked = [i for i, t in enumerate(out["x"]) if t == mask_id]
    occurrences = [(i, i + 4) for i in (TEXT.index("Mupi"), TEXT.rindex("Mupi"))]
    assert all(any(s <= encoding.offsets[i][0] < encoding.offsets[i][1] <= e for s, e in occurrences)
               for i in masked)
    assert {next(k for k, (s, e) in enumerate(occurrences) if s <= encoding.offsets[i][0] < e)
            for i in masked} == {0, 1}  # both occurrences
    assert [out["labels"][i] for i in masked] == [encoding.ids[i] for i in masked]
    assert all(out["labels"][i] == IGNORE for i in range(len(out["x"])) if i not in masked)


def test_a_span_cut_off_by_max_tokens_gives_no_example(tokenizer):
    encoding = tokenizer.encode(TEXT, add_special_tokens=False)
    last = salient_spans(TEXT)[-1]
    assert mask_span(encoding, TEXT, last, tokenizer.special_id("mask"), 3) is None


def test_examples_name_their_passage_and_answer(tokenizer):
    passages = [Passage("a", "t", "nothing salient here."), Passage("b", "t", TEXT)]
    examples = span_examples(tokenizer, passages, [0, 1])
    assert {e["source"] for e in examples} == {1}
    assert {e["answer"] for e in examples} == {"Migom Koudand", "Mupi", "1935", "Klirefaim", "Beatles",
                                               "May 5, 1961"}
    assert len(span_examples(tokenizer, passages, [1], per_passage=2)) == 2
