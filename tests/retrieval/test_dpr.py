"""The dense retriever on a tiny BERT: in-batch + hard-negative loss as DPR's eq. 2, training on the
one trainer lifts recall@k over the untrained encoder, a seed fixes the run, and the trained encoder
reloads from DIR/final with its tokenizer and options."""
from __future__ import annotations

import shutil

import pytest
import torch
import torch.nn.functional as F

import lmforge
from lmforge.retrieval.dpr import BiEncoder, DPRObjective, EncoderOptions
from lmforge.retrieval.evaluate import compare, recall_at_k, train_dpr
from lmforge.retrieval.passages import load_passages
from lmforge.retrieval.questions import builtin_questions
from lmforge.tokenizer.train import train_tokenizer
from lmforge.train import TrainConfig


@pytest.fixture(scope="module")
def data():
    passages = load_passages(None)
    questions = builtin_questions(passages)
    texts = [f"{p.title}. {p.text}" for p in passages] + [r["question"] for r in questions["train"]]
    return passages, questions, train_tokenizer(texts, "wordpiece", 400)


def _encoder(tokenizer, seed=0):
    torch.manual_seed(seed)
    model = lmforge.build("bert-base", n_layers=1, d_model=32, n_heads=2, d_ff=64,
                          vocab_size=tokenizer.vocab_size, max_seq_len=64)
    return BiEncoder(model, tokenizer, EncoderOptions(max_length=64))


def test_recall_at_k_counts_a_positive_in_the_first_k():
    records = [{"positives": ["a"]}, {"positives": ["b", "c"]}]
    assert recall_at_k([["x", "a"], ["c", "y"]], records, (1, 2)) == {"recall@1": 0.5, "recall@2": 1.0}


def test_the_loss_is_the_nll_of_the_positive_among_batch_passages_and_negatives(data):
    passages, questions, tokenizer = data
    encoder = _encoder(tokenizer)
    objective = DPRObjective(encoder).eval()
    ex = [{"question": encoder.ids(q), "positive": encoder.ids(p), "negatives": [encoder.ids(n)]}
          for q, p, n in (("who is ann", "ann is here", "bob"), ("where is bob", "bob sails", "ann"))]
    batch = objective.collate(ex)
    assert batch["p_input_ids"].shape[0] == 4 and not batch["same_passage"].any()
    q = F.normalize(encoder.encode(["who is ann", "where is bob"]), dim=-1)
    p = F.normalize(encoder.encode(["ann is here", "bob sails", "bob", "ann"]), dim=-1)
    want = F.cross_entropy(q @ p.T / 0.05, torch.arange(2))
    assert torch.allclose(objective(batch).loss, want, atol=1e-4)
    same = objective.collate([ex[0], {**ex[1], "positive": ex[0]["positive"]}])["same_passage"]
    assert same[0, 1] and same[1, 0] and not same[0, 0]  # a shared positive is no negative


def test_training_beats_the_untrained_encoder_and_reloads(data, tmp_path):
    passages, questions, tokenizer = data
    cfg = TrainConfig(steps=30, batch_size=8, lr=3e-3, warmup=3, progress=False, device="cpu", seed=3)
    trained = train_dpr(_encoder(tokenizer), questions["train"], passages, tmp_path / "a", cfg,
                        log=lambda m: None)
    table = compare(passages, questions["test"], {"untrained": _encoder(tokenizer), "trained": trained},
                    tmp_path)
    assert table["trained"]["recall@1"] > table["untrained"]["recall@1"] + 0.2
    assert table["trained"]["recall@5"] >= 0.9
    reloaded = BiEncoder.from_dir(tmp_path / "a" / "final")
    assert reloaded.options == trained.options
    text = ["Where was someone born?"]
    assert torch.allclose(reloaded.encode(text), trained.encode(text), atol=1e-6)


def test_a_seed_fixes_the_run(data, tmp_path):
    passages, questions, tokenizer = data
    cfg = TrainConfig(steps=3, batch_size=4, lr=1e-3, warmup=1, progress=False, device="cpu", seed=5)
    runs = [train_dpr(_encoder(tokenizer), questions["train"][:40], passages, tmp_path / name, cfg,
                      log=lambda m: None) for name in "ab"]
    for (name, a), b in zip(runs[0].model.state_dict().items(), runs[1].model.state_dict().values()):
        assert torch.equal(a, b), name


def test_a_resumed_run_ends_where_an_unbroken_one_does(data, tmp_path):
    passages, questions, tokenizer = data
    records = questions["train"][:40]
    cfg = dict(batch_size=4, lr=1e-3, warmup=1, progress=False, device="cpu", seed=2, save_every=2)
    whole = train_dpr(_encoder(tokenizer), records, passages, tmp_path / "whole", TrainConfig(steps=4, **cfg),
                      log=lambda m: None)
    shutil.copytree(tmp_path / "whole", tmp_path / "cut")  # as if killed after the step-2 checkpoint:
    checkpoints = sorted((tmp_path / "cut" / "checkpoints").iterdir())
    assert len(checkpoints) == 2
    shutil.rmtree(checkpoints[-1])  # the step-4 checkpoint goes
    shutil.rmtree(tmp_path / "cut" / "final")
    resumed = train_dpr(_encoder(tokenizer, seed=9), records, passages, tmp_path / "cut",
                        TrainConfig(steps=4, **cfg), resume=True, log=lambda m: None)
    assert (tmp_path / "cut" / "final" / "retriever.json").is_file()
    for (name, a), b in zip(whole.model.state_dict().items(), resumed.model.state_dict().values()):
        assert torch.equal(a, b), name


def test_a_resume_with_another_temperature_or_pooling_is_refused_naming_it(data, tmp_path):
    """The encoder options decide the loss (temperature) and the vectors (pooling): a resume with others
    would continue another run than the one its checkpoints hold."""
    passages, questions, tokenizer = data
    cfg = TrainConfig(steps=1, batch_size=4, warmup=0, progress=False, save_every=1)
    train_dpr(_encoder(tokenizer), questions["train"][:8], passages, tmp_path, cfg, log=lambda m: None)
    for option, value in (("temperature", 0.5), ("pooling", "cls")):
        other = _encoder(tokenizer)
        other.options = EncoderOptions(max_length=64, **{option: value})
        with pytest.raises(ValueError, match=f": {option}=.* \\(the run's\\) vs {value!r} \\(now\\)"):
            train_dpr(other, questions["train"][:8], passages, tmp_path, cfg, resume=True, log=lambda m: None)


def test_separate_encoders_train_apart_and_reload(data, tmp_path):
    passages, questions, tok = data
    encoder = _encoder(tok).separate()
    texts = [f"{p.title}. {p.text}" for p in passages[:4]]
    assert torch.allclose(encoder.encode(texts), encoder.encode(texts, passage=True))  # E_P starts as E_Q
    cfg = TrainConfig(steps=3, batch_size=8, lr=1e-3, warmup=0, progress=False)
    train_dpr(encoder, questions["train"][:16], passages, tmp_path, cfg)
    q, p = encoder.encode(texts), encoder.encode(texts, passage=True)
    assert not torch.allclose(q, p, atol=1e-4)  # each encoder got its own updates
    again = BiEncoder.from_dir(tmp_path / "final")
    assert again.passage_model is not None
    assert torch.allclose(again.encode(texts, passage=True), p, atol=1e-5)
    assert torch.allclose(again.encode(texts), q, atol=1e-5)


def test_another_positive_of_a_question_is_no_negative_for_it_in_the_batch(data):
    from lmforge.retrieval.dpr import training_examples

    passages, _, tokenizer = data
    encoder = _encoder(tokenizer)
    a, b, c = passages[:3]
    records = [{"question": "q one", "positives": [a.id, b.id]}, {"question": "q two", "positives": [b.id]},
               {"question": "q three", "positives": [c.id]}]
    examples = training_examples(encoder, records, passages, [[c.id], [a.id], [a.id]])
    same = DPRObjective(encoder).collate(examples)["same_passage"]
    # columns: positives a, b, c, then the hard negatives c, a, a
    assert same[0].tolist() == [False, True, False, False, True, True]  # b: its positive too; a: copies
    assert same[1].tolist() == [False, False, False, False, False, False]  # a is a true negative for two
    assert same[2].tolist() == [False, False, False, True, False, False]  # a copy of c
