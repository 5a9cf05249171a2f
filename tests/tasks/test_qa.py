"""Extractive QA: SQuAD reading, windows with a stride, n-best decoding across windows, SQuAD EM/F1."""
from __future__ import annotations

import json

import pytest
import torch

import lmforge
from lmforge.data.probes import tasks
from lmforge.io import find_model_dir
from lmforge.tasks import task_class
from lmforge.tasks.qa import QATask, Template, best_answer, features, window_spans, window_starts
from lmforge.tokenizer import train_tokenizer

WORDS = ("alpha bravo charlie delta echo frank golf hotel india juliet king lima mike november oscar papa "
         "quebec romeo sierra tango uniform victor whiskey x yankee zulu").split()


@pytest.fixture(scope="module")
def tok():
    """all-MiniLM-L6-v2's WordPiece tokenizer: one token per word of WORDS."""
    tok = lmforge.load_tokenizer(find_model_dir("all-MiniLM-L6-v2"))
    assert tok.tokenize(" ".join(WORDS)) == ["[CLS]", *WORDS, "[SEP]"]
    return tok


def record(answer_words: tuple, question="Which words?", id="q"):
    """A record over the WORDS context whose answer is WORDS[first..last] (() = unanswerable)."""
    context = " ".join(WORDS)
    answers = []
    if answer_words:
        text = " ".join(WORDS[answer_words[0]:answer_words[1] + 1])
        answers = [{"text": text, "start": context.index(text)}]
    return {"id": id, "question": question, "context": context, "answers": answers}


def oracle(window: dict, low: float = -5.0) -> tuple:
    """Logits that point at the window's gold start and end (at [CLS] when the answer is not inside)."""
    n = len(window["input_ids"])
    start, end = [low] * n, [low] * n
    start[window["start_positions"]] = end[window["end_positions"]] = 5.0
    return start, end


# ---- windows ----------------------------------------------------------------------------------------


def test_window_starts_cover_with_the_overlap():
    assert window_starts(10, 4, 1) == [0, 3, 6]  # [0,4) [3,7) [6,10)
    assert window_starts(11, 4, 2) == [0, 2, 4, 6, 8]
    assert window_starts(3, 4, 1) == [0] and window_starts(0, 4, 1) == [0]
    with pytest.raises(ValueError, match="doc_stride=4 must be smaller than the 4 context tokens"):
        window_starts(10, 4, 4)


def test_templates_of_bert_and_roberta_tokenizers(tok):
    assert Template.of(tok) == Template((tok.cls_id,), (tok.sep_id,), (tok.sep_id,), (0, 0, 0, 1, 1))
    roberta = train_tokenizer(["the cat sat on the mat"] * 5, "bytelevel-bpe", 300)
    t = Template.of(roberta)  # <s> q </s></s> c </s>
    s, e = roberta.special_id("bos"), roberta.special_id("eos")
    assert (t.before, t.between, t.after, t.n_special) == ((s,), (e, e), (e,), 4)


def test_windows_cross_the_answer_and_keep_offsets(tok):
    rec = record((7, 9))  # "hotel india juliet": tokens 7..9 of the context
    windows = features(tok, rec, Template.of(tok), max_len=12, doc_stride=3, max_query_len=8)
    # [CLS] which words ? [SEP] -> 5 tokens, 6 of context per window, one [SEP]; step 6 - 3 = 3
    assert [len(w["offsets"]) for w in windows] == [6, 6, 6, 6, 6, 6, 6, 5]
    assert all(len(w["input_ids"]) == len(w["segment_ids"]) <= 12 for w in windows)
    inside = []
    for k, w in enumerate(windows):  # window k holds context tokens 3k .. 3k+5
        ctx = [tok.id_to_token(i) for i in w["input_ids"][w["context_at"]:-1]]
        assert ctx == WORDS[3 * k:3 * k + 6]
        assert [rec["context"][s:e] for s, e in w["offsets"]] == ctx
        assert w["segment_ids"] == [0] * 5 + [1] * (len(w["input_ids"]) - 5)
        if w["start_positions"] != w["cls_index"]:
            inside.append(k)
            assert w["input_ids"][w["start_positions"]:w["end_positions"] + 1] == tok.encode(
                "hotel india juliet", add_special_tokens=False).ids
        else:
            assert w["end_positions"] == w["cls_index"] == 0
    # windows 1 (3..8) and 3 (9..14) hold only part of the answer: their target is [CLS]
    assert inside == [2]


def test_unanswerable_windows_point_at_cls(tok):
    windows = features(tok, record(()), Template.of(tok), max_len=16, doc_stride=4)
    assert len(windows) > 1
    assert all(w["start_positions"] == w["end_positions"] == 0 for w in windows)
    assert all("start_positions" not in w for w in features(tok, {"question": "q", "context": "a b"},
                                                             Template.of(tok)))


# ---- decoding -------------------------------------------------------------------------------------


@pytest.mark.parametrize("max_len, doc_stride", [(12, 3), (14, 5), (10, 2), (64, 8)])
def test_oracle_logits_recover_every_gold_span_across_windows(tok, max_len, doc_stride):
    crossing = 0
    for first in range(len(WORDS)):
        for last in range(first, min(first + 6, len(WORDS))):
            rec = record((first, last))
            windows = features(tok, rec, Template.of(tok), max_len=max_len, doc_stride=doc_stride)
            whole = [w for w in windows if w["start_positions"] != w["cls_index"]]
            answer, _ = best_answer(windows, [oracle(w) for w in windows], rec["context"], unanswerable=True)
            # an answer of at most overlap + 1 tokens always lies whole in a window; a longer one may not
            assert answer == (rec["answers"][0]["text"] if whole else "")
            assert whole or last - first > doc_stride
            s = rec["answers"][0]["start"]
            e = s + len(answer)
            cut = [w for w in windows
                   if w["offsets"][0][0] < e and w["offsets"][-1][1] > s and w not in whole]
            crossing += bool(whole and cut)  # a window boundary cuts it, another window holds it whole
    assert crossing > 20 or max_len == 64


def test_n_best_across_windows_picks_the_window_with_the_whole_answer(tok):
    rec = record((7, 9))
    windows = features(tok, rec, Template.of(tok), max_len=12, doc_stride=3, max_query_len=8)
    outputs = [([-5.0] * len(w["input_ids"]), [-5.0] * len(w["input_ids"])) for w in windows]
    # window 1 (tokens 3..8) sees the answer's start but not its end: a strong start, a weaker end at
    # its last context token; window 2 (6..11) holds it whole with a slightly weaker start
    start1, end1 = outputs[1]
    start1[5 + 4], end1[5 + 5] = 9.0, 1.0  # "hotel" .. "india" (context token 4, 5 of window 1)
    start2, end2 = outputs[2]
    start2[5 + 1], end2[5 + 3] = 8.0, 4.0  # "hotel" .. "juliet" of window 2: 12 > 10
    assert best_answer(windows, outputs, rec["context"])[0] == "hotel india juliet"
    assert best_answer(windows, outputs, rec["context"]) == ("hotel india juliet", 12.0)
    # windows are independent of their order
    assert best_answer(windows[::-1], outputs[::-1], rec["context"])[0] == "hotel india juliet"


def test_span_rules_end_after_start_max_length_and_context_only():
    # 3 question positions, then 6 context positions
    start = [9.0, 9.0, 9.0, 1.0, 0.0, 0.0, 0.0, 5.0, 0.0]
    end = [9.0, 9.0, 9.0, 0.0, 4.0, 0.0, 0.0, 0.0, 3.0]
    spans = window_spans(start, end, context_at=3, n_context=6, n_best=20, max_answer_len=30)
    assert spans[0] == (8.0, 4, 5)  # start 7 (context 4) .. end 8 (context 5); never the question
    assert all(s <= e for _, s, e in spans)
    assert window_spans(start, end, 3, 6, max_answer_len=1)[0] == (5.0, 4, 4)
    assert (8.0, 4, 5) not in window_spans(start, end, 3, 6, max_answer_len=1)
    assert window_spans(start, end, 3, 6, n_best=1) == []  # best start 4 x best end 1 only: no span


def test_unanswerable_null_score_and_threshold(tok):
    rec = record(())
    windows = features(tok, rec, Template.of(tok), max_len=16, doc_stride=4)
    outputs = [oracle(w) for w in windows]
    outputs[0][0][7], outputs[0][1][8] = 4.0, 4.0  # a span scoring 8 < null 10
    assert best_answer(windows, outputs, rec["context"], unanswerable=True) == ("", 10.0)
    assert best_answer(windows, outputs, rec["context"], unanswerable=True, null_threshold=2.5)[0] != ""
    assert best_answer(windows, outputs, rec["context"], unanswerable=False)[0] == "charlie delta"
    # the null score is the smallest over the windows: one window sure of a span is enough
    outputs[1][0][0] = outputs[1][1][0] = 2.0
    assert best_answer(windows, outputs, rec["context"], unanswerable=True)[0] == "charlie delta"

def test_window_spans_are_those_of_the_top_starts_and_ends_whatever_the_window():
    """window_spans walks each top start's admissible ends (n x max_answer_len, for the reader's every start x
    end) and gives what pairing the two top lists gives, in the same order, ties included."""
    import random

    rng = random.Random(0)
    for _ in range(200):
        n, n_best, most = rng.randint(1, 40), rng.randint(1, 45), rng.randint(1, 12)
        start = [float(rng.randint(-3, 3)) for _ in range(n)]  # few values: many ties
        end = [float(rng.randint(-3, 3)) for _ in range(n)]
        top = sorted(range(n), key=lambda k: -start[k])[:n_best]
        ends = sorted(range(n), key=lambda k: -end[k])[:n_best]
        pairs = [(start[s] + end[e], s, e) for s in top for e in ends if s <= e < s + most]
        assert window_spans(start, end, 0, n, n_best, most) == sorted(pairs, key=lambda x: -x[0])



# ---- the task ---------------------------------------------------------------------------------------


def test_task_on_the_builtin_questions(tok):
    torch.manual_seed(0)
    model = lmforge.build(lmforge.tiny("bert-base"), vocab_size=tok.vocab_size, max_seq_len=64)
    task = QATask(model, tok, max_len=32, doc_stride=8)
    assert task_class("qa") is QATask and list(model.heads) == ["span-qa"] and task.unanswerable is None
    records = [{"id": str(i), "question": r["question"], "context": r["context"],
                "answers": [{"text": r["answer"], "start": r["start"]}], "line": i}
               for i, r in enumerate(tasks(40, seed=0)["questions"]["validation"])]
    examples = task.encode_all(records)
    assert len(examples) > len(records)  # biographies need several 32-token windows
    # oracle outputs recover every gold answer exactly; the model's own are substrings of the context
    gold = [r["answers"][0]["text"] for r in records]
    assert task.decode(records, examples, [oracle(e) for e in examples]) == gold
    predictions, scores = task.evaluate(records, batch_size=8)
    assert all(p in r["context"] for p, r in zip(predictions, records)) and 0 <= scores["f1"] <= 1
    loss = task(task.collate(examples[:4]))
    assert loss.loss.ndim == 0 and torch.isfinite(loss.loss)
    with pytest.raises(ValueError, match="line 3: answer 'x' is not at character 0"):
        task.encode({**records[0], "answers": [{"text": "x", "start": 0}], "line": 3})
    task.encode({**records[0], "answers": []})
    assert task.unanswerable is True  # SQuAD 2.0 data switches null answers on


def test_finetune_and_evaluate_plumbing_on_the_builtin_questions(tmp_path, tok):
    from lmforge.tasks.finetune import TaskConfig, evaluate, finetune
    from lmforge.tasks.formats import builtin
    from lmforge.train import TrainConfig

    kind, data = builtin("questions", 100, seed=0)
    torch.manual_seed(0)
    model = lmforge.build(lmforge.tiny("bert-base"), vocab_size=tok.vocab_size, max_seq_len=64)
    cfg = TrainConfig(steps=3, batch_size=8, lr=1e-3, warmup=1, log_every=1, progress=False, seed=0)
    summary = finetune(model, tok, kind, data["train"], data["validation"], tmp_path, cfg,
                       TaskConfig(max_len=40),
                       log=lambda *a: None)
    assert kind == "qa" and summary["primary"] == "f1" and set(summary["final"]) == {"f1", "exact_match"}
    scores = evaluate(tmp_path / "final", data["test"], out=tmp_path / "predictions.jsonl")
    assert set(scores) == {"f1", "exact_match"}
    rows = [json.loads(line) for line in (tmp_path / "predictions.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == [r["id"] for r in data["test"]]
    assert all(r["prediction"] in t["context"] for r, t in zip(rows, data["test"]))


def test_read_tokens_are_the_tokens_of_the_windows_encode_makes(tok):
    torch.manual_seed(0)
    model = lmforge.build(lmforge.tiny("bert-base"), vocab_size=tok.vocab_size, max_seq_len=64)
    task = QATask(model, tok, max_len=12, doc_stride=3, max_query_len=8)
    for answer in ((7, 9), ()):  # WORDS: 26 context tokens in 8 overlapping windows
        windows = task.encode(record(answer))
        question = len(tok.encode("Which words?", add_special_tokens=False).ids)
        assert task.read_tokens(question, len(WORDS)) == sum(len(w["input_ids"]) for w in windows)
    assert task.read_tokens(3, len(WORDS)) > 3 + len(WORDS)  # the overlaps are read twice
    assert task.read_tokens(3, 0) == 3 + task.template.n_special  # no context: one window, no room used
    assert task.read_tokens(20, 5) == 8 + 5  # a question that leaves no room: its tokens as given


def test_questions_cut_to_max_query_len_are_counted_and_said(tok):
    torch.manual_seed(0)
    model = lmforge.build(lmforge.tiny("bert-base"), vocab_size=tok.vocab_size, max_seq_len=64)
    task = QATask(model, tok, max_len=24, doc_stride=3, max_query_len=4)
    short, long = record((1, 2), question="alpha bravo"), record((1, 2), question=" ".join(WORDS[:9]))
    windows = task.encode_all([short, long, long])
    assert task.question_cut == 2 and task.cut == 0  # contexts are read whole, in windows
    # the cut question keeps its first max_query_len tokens, as before
    cut = [w for w in windows if w["record"] == 1][0]
    assert cut["input_ids"][1:cut["question_end"]] == \
        tok.encode(" ".join(WORDS[:4]), add_special_tokens=False).ids
    said = []
    task.say_cut(3, "evaluated", said.append)
    assert said == ["2 of 3 evaluated records have a question longer than max_query_len=4 tokens, cut to its "
                    "first 4; raise max_query_len to read more"]
    task.encode_all([short])  # each encode_all counts afresh
    said.clear()
    task.say_cut(1, "training", said.append)
    assert task.question_cut == 0 and said == []


def test_evaluate_says_how_many_questions_were_cut(tmp_path, tok):
    from lmforge.tasks.finetune import evaluate

    torch.manual_seed(0)
    model = lmforge.build(lmforge.tiny("bert-base"), vocab_size=tok.vocab_size, max_seq_len=64)
    QATask(model, tok, max_len=24, doc_stride=3, max_query_len=4)  # puts the span-qa head on
    records = [{**record((1, 2), question=" ".join(WORDS[:20]), id="a"), "line": 1},
               {**record((3, 4), question="alpha", id="b"), "line": 2}]
    said = []
    evaluate(model, records, kind="qa", tokenizer=tok, max_len=24, log=said.append)
    assert any(line.startswith("1 of 2 evaluated records have a question longer than max_query_len=12")
               for line in said), said  # the task's default: min(64, max_len // 2)


@pytest.mark.parametrize("answer, message", [
    ({"text": "charlie", "start": -len(" ".join(WORDS)) + 12}, "answer 'charlie' is not at character -"),
    ({"text": "", "start": 500}, "line 4: the answer text is empty"),
    ({"text": " ", "start": 5}, "line 4: the answer text is empty"),
])
def test_encode_refuses_answers_that_would_train_as_unanswerable(tok, answer, message):
    # each passed the old check (a slice at a negative start, or "" found anywhere) and its gold
    # positions fell on [CLS]: an answerable question trained as unanswerable, unsaid
    torch.manual_seed(0)
    model = lmforge.build(lmforge.tiny("bert-base"), vocab_size=tok.vocab_size, max_seq_len=64)
    task = QATask(model, tok, max_len=24, doc_stride=3)
    rec = {**record(()), "answers": [answer], "line": 4}
    assert rec["context"][answer["start"]:answer["start"] + len(answer["text"])] == answer["text"]
    with pytest.raises(ValueError, match=message):
        task.encode(rec)
