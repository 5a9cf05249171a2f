"""The QA task on the reference's Longformer and BigBird QA models: their question rules (global question
tokens; masked question logits and the checkpoint's own QA head) give the reference's logits, loss and
answers, through the task as a user runs it; the retrieval reader reads a passage by the same rules."""
import pytest
import torch

from lmforge.retrieval.passages import Passage
from lmforge.retrieval.reader import ExtractiveReader
from lmforge.tasks.qa import QATask
from lmforge.tokenizer import train_tokenizer

from tests.parity.helpers import assert_span_logits_parity, load_reference, transformers

CONTEXT = ("the cat sat on the mat while the dog ran in the park and the bird sang on the tree near "
           "the old house by the river where the fish swam")
QUESTIONS = (("where did the cat sit", "on the mat"), ("who sang", "the bird"), ("what swam", "the fish"))
RECORDS = [{"id": str(i), "question": q, "context": CONTEXT,
            "answers": [{"text": a, "start": CONTEXT.index(a)}]} for i, (q, a) in enumerate(QUESTIONS)]


def _longformer(tok):
    cfg = transformers.LongformerConfig(
        vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=66, type_vocab_size=1, layer_norm_eps=1e-5,
        attention_window=[4, 8], pad_token_id=tok.pad_id, sep_token_id=tok.special_id("eos"),
        bos_token_id=tok.special_id("bos"))
    return transformers.LongformerForQuestionAnswering(cfg), 40  # windows of 40 tokens


def _big_bird(tok):
    cfg = transformers.BigBirdConfig(
        vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=64, block_size=4, num_random_blocks=1,
        pad_token_id=tok.pad_id, sep_token_id=tok.sep_id)
    return transformers.BigBirdForQuestionAnswering(cfg), 48  # > 28 tokens a window: block-sparse


ARCHITECTURES = {"longformer": ("bytelevel-bpe", _longformer), "big_bird": ("wordpiece", _big_bird)}


def _setup(tmp_path, name):
    """(task on the loaded checkpoint, the reference, a batch of every window)."""
    kind, make = ARCHITECTURES[name]
    tok = train_tokenizer([CONTEXT, *(q for q, _ in QUESTIONS)] * 5, kind, 300)
    torch.manual_seed(0)
    reference, max_len = make(tok)
    task = QATask(load_reference(reference, tmp_path), tok, max_len=max_len, doc_stride=8)
    examples = task.encode_all(RECORDS)
    return task, reference.eval(), examples, task.collate(examples)


@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_logits_and_answers_are_the_references(tmp_path, name):
    """No global mask / question lengths given to the reference: it derives them, as the task does."""
    task, reference, examples, batch = _setup(tmp_path, name)
    with torch.no_grad():
        theirs = reference(batch["input_ids"], attention_mask=batch["attention_mask"])
        ours = task.logits(batch)
    assert_span_logits_parity(ours, theirs, batch["attention_mask"])
    lengths = batch["attention_mask"].sum(1).tolist()
    outputs = [(s[:n].tolist(), e[:n].tolist())
               for s, e, n in zip(theirs.start_logits, theirs.end_logits, lengths)]
    predictions, _ = task.evaluate(RECORDS, examples=examples)
    assert predictions == task.decode(RECORDS, examples, outputs)


@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_loss_is_the_references(tmp_path, name):
    """On unpadded windows (the reference scores padding): BigBird's masked question leaves the softmax."""
    task, reference, examples, _ = _setup(tmp_path, name)
    longest = max(len(e["input_ids"]) for e in examples)
    batch = task.collate([e for e in examples if len(e["input_ids"]) == longest])
    with torch.no_grad():
        theirs = reference(batch["input_ids"], attention_mask=batch["attention_mask"],
                           start_positions=batch["start_positions"], end_positions=batch["end_positions"])
        ours = task(batch).loss
    torch.testing.assert_close(ours, theirs.loss, atol=1e-5, rtol=1e-4)


def test_big_bird_keeps_the_checkpoints_qa_head(tmp_path):
    """Its head runs a feed-forward sub-layer first (ffn=True): a task that made a plain head instead
    answered with untrained weights."""
    task, _, _, _ = _setup(tmp_path, "big_bird")
    assert task.task_head.spec == {"kind": "span-qa", "ffn": True}
    assert task.model.heads["span-qa"] is task.task_head


def test_the_question_rules_change_the_outputs(tmp_path):
    """Not vacuous: the Longformer's global question and BigBird's question mask move the logits."""
    task, _, _, batch = _setup(tmp_path / "l", "longformer")
    with torch.no_grad():
        ruled = task.logits(batch)
        task.rules.global_question = False
        plain = task.logits(batch)
    assert (ruled - plain)[batch["attention_mask"].bool()].abs().max() > 1e-4
    task, _, _, batch = _setup(tmp_path / "b", "big_bird")
    with torch.no_grad():
        logits = task.logits(batch)
    question = torch.arange(batch["input_ids"].shape[1])[None] <= batch["question_end"][:, None]
    assert (logits[:, 1:][question[:, 1:]] < -1e5).all() and (logits[:, 0] > -1e5).all()


@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_the_retrieval_reader_reads_by_the_references_rules(tmp_path, name):
    """DPR's reader on such a checkpoint: its span logits over each passage's window are the reference
    QA model's (the rules live in one place, tasks.qa.QuestionRules)."""
    task, reference, _, _ = _setup(tmp_path, name)
    reader = ExtractiveReader(task.model, task.tokenizer, max_len=task.max_len)
    texts = (CONTEXT[:60], CONTEXT[40:], CONTEXT)
    passages = [Passage(str(i), "animals", text) for i, text in enumerate(texts)]
    groups = [reader.group(q, [a], passages[0], passages[1:]) for q, a in QUESTIONS]
    batch = reader.collate(groups)
    with torch.no_grad():
        span, _ = reader.scores(batch)
        theirs = reference(batch["input_ids"], attention_mask=batch["attention_mask"])
    assert_span_logits_parity(span, theirs, batch["attention_mask"])
