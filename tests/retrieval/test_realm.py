"""REALM on tiny BERTs over the built-in passages: the marginal log p(y | x) against a hand computation,
the reader's "[CLS] x [SEP] z [SEP]" inputs, no trivial retrieval, the null document, gradients into
the knowledge-augmented encoder and both retriever encoders, the index refreshed on schedule, and a
resumed run identical to an uninterrupted one (index included)."""
from __future__ import annotations

import math
import shutil

import pytest
import torch

import lmforge
from lmforge.objectives.base import IGNORE
from lmforge.retrieval.dpr import BiEncoder, EncoderOptions, passage_text
from lmforge.retrieval.passages import load_passages
from lmforge.retrieval.realm import REALMObjective, realm_log_likelihood
from lmforge.retrieval.salient import span_examples
from lmforge.tokenizer.train import train_tokenizer
from lmforge.train import TrainConfig
from lmforge.train.loop import Trainer


def test_marginal_matches_a_hand_computation():
    # two documents with p(z | x) = 0.25, 0.75 and p(y | z, x) = 0.8, 0.1: p(y | x) = 0.2 + 0.075
    doc = torch.log(torch.tensor([[0.25, 0.75]]))
    span = torch.log(torch.tensor([[0.8, 0.1]]))
    assert math.isclose(float(realm_log_likelihood(span, doc)), math.log(0.275), rel_tol=1e-6)


@pytest.fixture(scope="module")
def parts():
    passages = load_passages(None)[:40]
    tok = train_tokenizer([passage_text(p) for p in passages], "wordpiece", 300)
    return passages, tok, span_examples(tok, passages, list(range(len(passages))), max_tokens=32)


def _bert(tok, seed):
    torch.manual_seed(seed)
    return lmforge.build("bert-base", n_layers=1, d_model=32, n_heads=2, d_ff=64, vocab_size=tok.vocab_size,
                         max_seq_len=128)


def _objective(parts, k=3, **options):
    passages, tok, _ = parts
    retriever = BiEncoder(_bert(tok, 0), tok, EncoderOptions(max_length=64)).separate()
    return REALMObjective(_bert(tok, 1), retriever, passages, k=k, **{"max_len": 128, **options})


def test_a_reader_input_longer_than_the_encoder_takes_is_refused(parts):
    with pytest.raises(ValueError, match="max_len=129 .* max_seq_len=128"):
        _objective(parts, max_len=129)


def test_reader_reads_x_then_each_document_and_never_its_own_passage(parts):
    objective = _objective(parts).eval()
    batch = objective.collate(parts[2][:4])
    doc_logp, rows = objective.retrieve(batch)
    assert rows.shape == (4, 4) and (rows[:, -1] == -1).all()  # k documents, then the null one
    assert not (rows[:, :-1] == batch["source"][:, None]).any()
    assert torch.allclose(doc_logp.exp().sum(-1), torch.ones(4))
    inputs = objective.reader_inputs(batch, rows)
    n = int(batch["x_len"][0])
    x = batch["x"][0, :n].tolist()
    first = inputs["input_ids"][0, :int(inputs["attention_mask"][0].sum())].tolist()
    doc = objective.doc_tokens[int(rows[0, 0])]
    assert first[:n + 2] == [objective.cls, *x, objective.sep] and first[n + 2:-1] == doc[:len(first) - n - 3]
    assert inputs["segment_ids"][0, n + 2:len(first)].eq(1).all() and \
        inputs["segment_ids"][0, :n + 2].eq(0).all()
    null = inputs["input_ids"][3, :int(inputs["attention_mask"][3].sum())].tolist()
    assert null == [objective.cls, *x, objective.sep]
    labels = inputs["labels"][0, 1:n + 1]
    assert labels.tolist() == batch["labels"][0, :n].tolist() and (labels != IGNORE).any()


def test_loss_is_the_marginal_over_documents_read_one_at_a_time(parts):
    objective = _objective(parts, k=2).eval()
    batch = objective.collate(parts[2][:2])
    with torch.no_grad():
        loss = float(objective(batch).loss)
        doc_logp, rows = objective.retrieve(batch)
        inputs = objective.reader_inputs(batch, rows)
        total = 0.0
        for b in range(2):
            terms = []
            for z in range(rows.shape[1]):
                i = b * rows.shape[1] + z
                n = int(inputs["attention_mask"][i].sum())
                hidden = objective.model(inputs["input_ids"][i:i + 1, :n],
                                         segment_ids=inputs["segment_ids"][i:i + 1, :n],
                                         run_heads=False).last_hidden_state[0]
                labels = inputs["labels"][i]  # x's positions only (shorter than the input)
                logp = torch.log_softmax(objective.lm(hidden[:len(labels)]), -1)
                where = labels != IGNORE
                terms.append(float(doc_logp[b, z])
                             + float(logp[where].gather(1, labels[where][:, None]).sum()))
            total -= float(torch.logsumexp(torch.tensor(terms), 0))
    assert math.isclose(loss, total / 2, rel_tol=1e-4)


def test_gradient_reaches_the_reader_and_both_retriever_encoders(parts):
    objective = _objective(parts).train()
    objective(objective.collate(parts[2][:4])).loss.backward()
    for module in (objective.model, objective.input_encoder, objective.doc_encoder):
        assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in module.parameters())
    assert objective.index.grad is None


def test_index_is_refreshed_every_n_training_forwards(parts):
    objective = _objective(parts, refresh_every=2).train()
    batch = objective.collate(parts[2][:4])
    optimizer = torch.optim.SGD(objective.parameters(), lr=1.0)
    seen = []
    for _ in range(3):
        seen.append(objective.index.clone())
        objective(batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    seen.append(objective.index.clone())
    # forwards 1 and 2 use the starting index; the third (after two updates) refreshes it first
    assert torch.equal(seen[0], seen[1]) and torch.equal(seen[1], seen[2]) and \
        not torch.equal(seen[2], seen[3])
    fresh = objective.retriever.encode_ids(objective.doc_inputs, passage=True)
    assert not torch.allclose(seen[3], fresh)  # one more update since: stale again
    objective.refresh()
    assert torch.allclose(objective.index, fresh)


def test_null_document_alone_is_plain_salient_span_mlm(parts):
    objective = _objective(parts, k=0).eval()
    batch = objective.collate(parts[2][:3])
    doc_logp, rows = objective.retrieve(batch)
    assert rows.tolist() == [[-1]] * 3 and torch.allclose(doc_logp, torch.zeros(3, 1))
    objective.train().forwards.fill_(objective.refresh_every)
    objective(batch)
    assert not objective.index.any()  # no document is read, so the corpus is never embedded
    with pytest.raises(ValueError, match="null"):
        _objective(parts, k=0, null_document=False)


def test_resumed_run_equals_an_uninterrupted_one(parts, tmp_path):
    def run(out, steps, resume=False):
        objective = _objective(parts, refresh_every=2)
        cfg = TrainConfig(steps=steps, batch_size=4, lr=1e-3, warmup=0, log_every=1, save_every=3, seed=3,
                          progress=False, eval_every=0)
        Trainer(objective, parts[2], cfg, out, log=lambda m: None).fit(resume=resume)
        return objective.state_dict()

    whole = run(tmp_path / "a", 4)
    # as if killed after the step-3 checkpoint, whose index was refreshed before step 3
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    shutil.rmtree(sorted((tmp_path / "b" / "checkpoints").iterdir())[-1])
    shutil.rmtree(tmp_path / "b" / "final")
    resumed = run(tmp_path / "b", 4, resume=True)
    assert int(whole["forwards"]) == 4
    assert all(torch.equal(whole[k], resumed[k]) for k in whole)
    # another refresh period would read other (staler or fresher) documents: refused, naming it
    cfg = TrainConfig(steps=4, progress=False)
    other = Trainer(_objective(parts, refresh_every=3), parts[2], cfg, tmp_path / "b")
    with pytest.raises(ValueError, match="refresh_every=2 \\(the run's\\) vs 3 \\(now\\)"):
        other.resume()
