"""The reader's span loss is DPR's marginal over every answer span in the positive's window: one span
gives the start and end cross-entropies' sum, two give -logsumexp over both by hand, an answer past the
window adds nothing, and at most MAX_SPANS spans are kept; on fixed logits the loss is DPR's, worked by
hand; the spans come from the window's own encoding; answers match as whole words only (gold spans and
negatives); reading takes the best bounded span of the passage
over every start and end, as DPR's get_best_spans."""
from __future__ import annotations

import math
import re

import pytest
import torch
import torch.nn.functional as F

import lmforge
from lmforge.retrieval.dpr import passage_text
from lmforge.retrieval.passages import Passage, load_passages
from lmforge.retrieval.reader import (MAX_SPANS, ExtractiveReader, answer_spans, reader_examples, token_spans,
                                      window)
from lmforge.tasks.qa import answer_tokens
from lmforge.tokenizer.train import train_tokenizer

FILLER = "the river runs past the old mill and the hill " * 3


@pytest.fixture(scope="module")
def reader():
    tok = train_tokenizer([passage_text(p) for p in load_passages(None)] + [FILLER, "Paris Rome"],
                          "wordpiece", 300)
    torch.manual_seed(0)
    model = lmforge.build("bert-base", n_layers=1, d_model=32, n_heads=2, d_ff=64, vocab_size=tok.vocab_size,
                          max_seq_len=128)
    return ExtractiveReader(model, tok, max_len=128).eval()


def _batch(reader, text, answers=("Paris",)):
    positive, negative = Passage("p", "City", text), Passage("n", "Other", FILLER)
    example = reader.group("where is it?", list(answers), positive, [negative])
    return example["windows"][0], reader.collate([example])


@torch.no_grad()
def _span_loss(reader, batch):
    """The reader's loss less its selection term (recomputed from the same logits)."""
    span, select = reader.scores(batch)
    selection = F.cross_entropy(select.view(1, -1), torch.zeros(1, dtype=torch.long))
    return reader(batch).loss - selection, torch.log_softmax(span[0], dim=0)


def _text(w, text, span):
    """The passage characters a window's span covers (the tiny tokenizer reads "PARIS" as [UNK])."""
    first, last = (w["offsets"][k - w["context_at"]] for k in span)
    return passage_text(Passage("p", "City", text))[first[0]:last[1]]


def test_one_occurrence_gives_the_start_and_end_cross_entropies_sum(reader):
    w, batch = _batch(reader, "it is in Paris now")
    assert w["answer_spans"] == [(w["start_positions"], w["end_positions"])]
    assert _text(w, "it is in Paris now", w["answer_spans"][0]) == "Paris"
    with torch.no_grad():
        span, _ = reader.scores(batch)
    whole = (F.cross_entropy(span[:1, :, 0], torch.tensor([w["start_positions"]]))
             + F.cross_entropy(span[:1, :, 1], torch.tensor([w["end_positions"]])))
    assert abs(float(_span_loss(reader, batch)[0] - whole)) < 1e-6


def test_two_occurrences_give_the_marginal_over_both(reader):
    text = "paris is big and PARIS is old"
    w, batch = _batch(reader, text, answers=("Paris", "paris"))
    assert len(w["answer_spans"]) == 2  # case-insensitive, the same span once though two answers match it
    assert [_text(w, text, s) for s in w["answer_spans"]] == ["paris", "PARIS"]
    loss, logp = _span_loss(reader, batch)
    (s1, e1), (s2, e2) = w["answer_spans"]
    by_hand = -torch.logsumexp(torch.stack([logp[s1, 0] + logp[e1, 1], logp[s2, 0] + logp[e2, 1]]), 0)
    assert abs(float(loss - by_hand)) < 1e-6


def test_answers_match_whole_words_only():
    """As DPR's token match: never inside a longer word or number, case-insensitive, beside punctuation."""
    assert answer_spans("Romeo met Rome in 1990", ["Rome", "1"]) == [(10, 14)]
    assert answer_spans("Romeo and Romeos", ["Rome"]) == []
    assert answer_spans("1990 and 21", ["1"]) == []
    for text in ("Rome,", "(Rome)", "rome."):
        start = text.lower().index("rome")
        assert answer_spans(text, ["Rome"]) == [(start, start + 4)], text
    assert answer_spans("in 1 year", ["1"]) == [(3, 4)]


def test_a_multi_word_answer_matches_across_a_single_space():
    text = "from New York, not New Yorkers or new york."
    assert [text[s:e] for s, e in answer_spans(text, ["New York"])] == ["New York", "new york"]


def test_a_passage_holding_only_a_longer_word_is_a_negative(reader, monkeypatch):
    """A passage of "Romeo" does not hold the answer "Rome": a negative; one of "Rome," holds it: never a
    negative."""
    passages = [Passage("p", "City", "Rome is old."), Passage("romeo", "Play", "Romeo loved Juliet."),
                Passage("also", "City", "It is Rome, the capital.")]
    monkeypatch.setattr(reader, "group", lambda q, a, pos, negs: (pos.id, [n.id for n in negs]))
    record = {"question": "which city?", "answers": ["Rome"], "positives": ["p"]}
    assert reader_examples(reader, [record], passages, [["also", "romeo"]], 1) == [("p", ["romeo"])]
    assert reader_examples(reader, [record], passages, [["also"]], 1) == []  # "Rome," holds it: no negative


def test_an_answer_past_the_window_adds_nothing(reader):
    text = "Paris is here. " + FILLER * 4 + " Paris"
    assert len(answer_spans(passage_text(Passage("p", "City", text)), ["Paris"])) == 2
    w, batch = _batch(reader, text)
    assert len(w["answer_spans"]) == 1 and batch["answer_spans"].shape == (1, 1, 2)
    assert w["offsets"][-1][1] < passage_text(Passage("p", "City", text)).rindex("Paris")  # truly past it
    loss, logp = _span_loss(reader, batch)
    (s, e), = w["answer_spans"]
    assert abs(float(loss + logp[s, 0] + logp[e, 1])) < 1e-6
    # the only occurrence past the window: the [CLS] position is the span, as before
    w, _ = _batch(reader, FILLER * 4 + " Paris")
    cls = w["cls_index"]
    assert w["answer_spans"] == [(cls, cls)] == [(w["start_positions"], w["end_positions"])]


def test_at_most_max_spans_are_kept(reader):
    text = " ".join(["Rome Paris"] * (MAX_SPANS + 4))
    w, batch = _batch(reader, text)
    assert w["offsets"][-1][1] == len(passage_text(Passage("p", "City", text)))  # all 14 inside the window
    assert len(answer_spans(passage_text(Passage("p", "City", text)), ["Paris"])) == MAX_SPANS + 4
    assert len(w["answer_spans"]) == MAX_SPANS == batch["answer_spans"].shape[1]
    assert all(_text(w, text, s) == "Paris" for s in w["answer_spans"])
    assert w["answer_spans"] == sorted(w["answer_spans"])  # the first ten, left to right


def test_padded_spans_of_a_batch_do_not_count(reader):
    one = reader.group("q?", ["Paris"], Passage("a", "A", "in Paris"), [Passage("n", "N", FILLER)])
    two = reader.group("q?", ["Paris"], Passage("b", "B", "Paris and Paris"), [Passage("n", "N", FILLER)])
    batch = reader.collate([one, two])
    assert batch["answer_spans"][0, 1].tolist() == [-1, -1]
    span, select = reader.scores(batch)
    logp = torch.log_softmax(span[::2], dim=1)
    nll = [-torch.logsumexp(torch.stack([logp[b, s, 0] + logp[b, e, 1] for s, e in spans if s >= 0]), 0)
           for b, spans in enumerate(batch["answer_spans"].tolist())]
    selection = F.cross_entropy(select.view(2, 2), torch.zeros(2, dtype=torch.long))
    loss = reader(batch).loss
    assert torch.isfinite(loss) and torch.allclose(loss, selection + torch.stack(nll).mean(), atol=1e-6)


def test_the_loss_on_fixed_logits_is_dpr_s_worked_by_hand(reader, monkeypatch):
    """One question, its positive and one negative, four positions, spans (1, 2) and (3, 3): selection
    P(positive) = 3 / 4, P(spans) = 0.2 x 0.25 + 0.4 x 0.25 = 0.15; DPR's loss -log(3/4) - log(0.15) =
    log(80 / 9) (the halved span term gave -log(3/4) - log(0.15) / 2)."""
    start = torch.tensor([0.1, 0.2, 0.3, 0.4]).log()
    span = torch.stack([torch.stack([start, torch.zeros(4)], -1), torch.zeros(4, 2)])  # (2, T, 2)
    select = torch.tensor([3.0, 1.0]).log()
    monkeypatch.setattr(reader, "scores", lambda batch: (span, select))
    loss = reader({"group": torch.tensor(2), "answer_spans": torch.tensor([[[1, 2], [3, 3]]])}).loss
    assert abs(float(loss) - math.log(80 / 9)) < 1e-6


class _Counting:
    """The reader's tokenizer, counting the texts it encodes."""

    def __init__(self, tokenizer) -> None:
        self.inner, self.texts = tokenizer, []

    def encode(self, text, **kwargs):
        self.texts.append(text)
        return self.inner.encode(text, **kwargs)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_a_positive_is_encoded_once_when_its_example_is_built(reader):
    positive = Passage("p", "City", "Paris is here and Paris is there. " + FILLER)
    counting = _Counting(reader.tokenizer)
    w = window(counting, reader.template, "where is it?", positive, ["Paris"], 128)
    assert len(w["answer_spans"]) == 2
    assert counting.texts.count(passage_text(positive)) == 1


def test_the_window_spans_are_those_of_the_whole_context_mapping(reader):
    """Every two-word span around the window's end, in or out exactly as the mapping over the whole
    context's encoding puts it (the rule token_spans had when it encoded the context again)."""
    context = passage_text(Passage("p", "City", FILLER * 4))
    w = window(reader.tokenizer, reader.template, "where is it?", Passage("p", "City", FILLER * 4), (), 64)
    offsets, end = reader.tokenizer.encode(context, add_special_tokens=False).offsets, w["offsets"][-1][1]
    assert len(offsets) > len(w["offsets"])  # the window cuts the context
    words = list(re.finditer(r"\S+", context))
    pairs = [(a.start(), b.end()) for a, b in zip(words, words[1:]) if abs(a.start() - end) < 40]
    for start, stop in pairs + [(end - 1, end + 1), (end, end + 1)]:
        first, last = answer_tokens(offsets, start, stop)
        whole = [] if first is None or last >= len(w["offsets"]) else \
            [(first + w["context_at"], last + w["context_at"])]
        assert token_spans(context, [(start, stop)], w) == whole, (start, stop)
    inside = [bool(token_spans(context, [p], w)) for p in pairs]
    assert any(inside) and not all(inside)  # both sides of the window's end are tried


def test_reading_takes_the_best_bounded_span_of_every_start_and_end(reader, monkeypatch):
    """Fixed logits on the context's tokens c: starts 5 + c / 100 at c = 20..39, ends 5 at c = 0..19 and 1 at
    c = 39, the question, [CLS] and [SEP] 100: the best span of the passage's own tokens is (39, 39), 6.39;
    the top 20 starts all lie past the top 20 ends (a top-20 x top-20 cut found no span and read "")."""
    passages = [Passage("a", "A", FILLER * 2), Passage("b", "B", FILLER * 2)]
    w = window(reader.tokenizer, reader.template, "where is it?", passages[1], (), reader.max_len)
    at, n = w["context_at"], len(w["offsets"])
    assert n > 40

    def scores(batch):
        logits = torch.full((*batch["input_ids"].shape, 2), 100.0)  # question and specials would win
        logits[:, at:at + n] = 0.0
        logits[:, at + 20:at + 40, 0] = 5 + torch.arange(20, 40) / 100
        logits[:, at:at + 20, 1], logits[:, at + 39, 1] = 5.0, 1.0
        return logits, torch.tensor([0.0, 2.0])

    monkeypatch.setattr(reader, "scores", scores)
    result = reader.read("where is it?", passages, max_answer_len=10)
    first, last = w["offsets"][39]
    assert result["id"] == "b" and result["answer"] == passage_text(passages[1])[first:last]
