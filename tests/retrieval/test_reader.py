"""The extractive reader over retrieved passages on a tiny BERT: the positive's span covers its
answer, the loss is passage selection + span NLL by hand, its gradient reaches both heads, and
reading returns a span of the best-selected passage; a trained reader reloads with its heads."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import lmforge
from lmforge.retrieval.bm25 import BM25Index
from lmforge.retrieval.dpr import passage_text
from lmforge.retrieval.evaluate import bm25_rankings
from lmforge.retrieval.passages import load_passages
from lmforge.retrieval.questions import builtin_questions
from lmforge.retrieval.reader import ExtractiveReader, reader_exact_match, reader_examples
from lmforge.tokenizer.train import train_tokenizer


@pytest.fixture(scope="module")
def parts():
    passages = load_passages(None)
    records = builtin_questions(passages)["train"][:6]
    tokenizer = train_tokenizer([passage_text(p) for p in passages], "wordpiece", 300)
    return passages, records, tokenizer


def _reader(tok):
    torch.manual_seed(0)
    model = lmforge.build("bert-base", n_layers=1, d_model=32, n_heads=2, d_ff=64, vocab_size=tok.vocab_size,
                          max_seq_len=128)
    return ExtractiveReader(model, tok, max_len=96)


def _examples(reader, parts, n_negatives=2):
    passages, records, _ = parts
    ranked = bm25_rankings(BM25Index.build(passages), passages, records, 20)
    return reader_examples(reader, records, passages, ranked, n_negatives)


def test_the_positive_span_covers_the_answer(parts):
    reader = _reader(parts[2])
    examples = _examples(reader, parts)
    assert len(examples) == len(parts[1])
    for example, record in zip(examples, parts[1]):
        w = example["windows"][0]
        span = w["input_ids"][w["start_positions"]:w["end_positions"] + 1]
        assert reader.tokenizer.decode(span).replace(" ", "").lower() == \
            record["answers"][0].lower().replace(" ", "")
        assert all("start_positions" not in n for n in example["windows"][1:])  # negatives: no span target


def test_the_loss_is_selection_plus_span_nll_and_trains_both_heads(parts):
    reader = _reader(parts[2]).eval()
    batch = reader.collate(_examples(reader, parts)[:3])
    assert batch["input_ids"].shape[0] == 9 and int(batch["group"]) == 3
    span, select = reader.scores(batch)
    logp = torch.log_softmax(span[::3], dim=1)  # (3, T, 2)
    marginal = [-torch.logsumexp(torch.stack([logp[b, s, 0] + logp[b, e, 1] for s, e in row if s >= 0]), 0)
                for b, row in enumerate(batch["answer_spans"].tolist())]
    by_hand = (F.cross_entropy(select.view(3, 3), torch.zeros(3, dtype=torch.long))
               + torch.stack(marginal).mean())
    loss = reader(batch).loss
    assert torch.allclose(loss, by_hand, atol=1e-5)
    loss.backward()
    for head in (reader.span, reader.select):
        assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in head.parameters())


def test_reading_returns_a_span_of_the_best_selected_passage(parts, tmp_path):
    passages, records, tok = parts
    reader = _reader(tok)
    result = reader.read(records[0]["question"], passages[:4])
    chosen = next(p for p in passages[:4] if p.id == result["id"])
    assert result["answer"] and result["answer"] in passage_text(chosen)
    # a strong retrieval score decides the passage when weighted in
    result = reader.read(records[0]["question"], passages[:4], [0.0, 0.0, 50.0, 0.0], retrieval_weight=1.0)
    assert result["id"] == passages[2].id
    reader.finish().save(tmp_path)
    tok.save(tmp_path)
    again = ExtractiveReader.from_dir(tmp_path, max_len=96)
    assert again.read(records[0]["question"], passages[:4]) == \
        reader.read(records[0]["question"], passages[:4])
    ranked = [[p.id for p in passages[:3]] for _ in records[:2]]
    assert 0.0 <= reader_exact_match(reader, records[:2], passages, ranked, k=3) <= 1.0


def test_a_decoder_is_refused_as_a_reader_naming_the_model_field(parts):
    """An OptionsError on "model", as DPR's encoder check is: the command line names its --model."""
    from lmforge.config.options import OptionsError

    decoder = lmforge.build("gpt2", n_layers=1, d_model=32, n_heads=2, d_ff=64,
                            vocab_size=parts[2].vocab_size)
    with pytest.raises(OptionsError, match="a reader must be an encoder model, not decoder") as refused:
        ExtractiveReader(decoder, parts[2])
    assert refused.value.field == "model"
