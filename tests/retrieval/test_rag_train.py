"""The end-to-end RAG objective on a tiny BERT retriever and a tiny BART generator: its inputs are
[CLS] passage [SEP] question [SEP] per retrieved passage, closed-book (k = 0) it is the generator's own
answer NLL, its gradient reaches the question encoder (not the fixed index), it decodes answers, and a
generator given the right passage learns to copy its title (the answer) for questions it never saw."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import lmforge
from lmforge.retrieval.dpr import BiEncoder, EncoderOptions
from lmforge.retrieval.passages import load_passages
from lmforge.retrieval.questions import builtin_questions
from lmforge.retrieval.rag_train import (RAGObjective, answer_matches, exact_match_rate, passage_tokens,
                                         rag_examples)
from lmforge.tasks.qa import exact_match
from lmforge.tokenizer.train import train_tokenizer


@pytest.fixture(scope="module")
def parts():
    passages = load_passages(None)
    records = builtin_questions(passages)["train"][:8]
    tokenizer = train_tokenizer([f"{p.title}. {p.text}" for p in passages] + [r["question"] for r in records],
                                "wordpiece", 300)
    return passages, records, tokenizer


def _objective(parts, k, generator_tokenizer=None):
    """A tiny BERT retriever over the passages and a tiny BART generator (in generator_tokenizer's
    pieces, default the retriever's)."""
    passages, _, tok = parts
    gen_tok = generator_tokenizer or tok
    torch.manual_seed(0)
    bert = lmforge.build("bert-base", n_layers=1, d_model=32, n_heads=2, d_ff=64, vocab_size=tok.vocab_size,
                         max_seq_len=64)
    retriever = BiEncoder(bert, tok, EncoderOptions(max_length=64))
    generator = lmforge.build(lmforge.tiny("bart-base"), vocab_size=gen_tok.vocab_size, max_seq_len=128,
                              decoder_start_token_id=gen_tok.special_id("cls"),
                              pad_token_id=gen_tok.special_id("pad"))
    vectors = retriever.encode([f"{p.title}. {p.text}" for p in passages])
    return RAGObjective(generator, retriever, vectors, passage_tokens(retriever, passages, gen_tok), k=k,
                        tokenizer=generator_tokenizer).eval()


def test_generator_inputs_hold_the_question_and_each_retrieved_passage(parts):
    objective = _objective(parts, k=2)
    batch = objective.collate(rag_examples(objective.retriever, parts[1][:2]))
    doc_logp, rows = objective.retrieve(batch)
    assert doc_logp.shape == (2, 2) and torch.allclose(doc_logp.exp().sum(-1), torch.ones(2))
    ids, mask = objective.generator_inputs(batch, rows)
    assert ids.shape[0] == 4
    first = ids[1, :int(mask[1].sum())].tolist()  # question 0, its second passage
    question = batch["source"][0, :batch["source_len"][0]].tolist()
    passage = objective.passage_tokens[int(rows[0, 1])]
    n = len(first) - len(question) - 3  # the passage's tokens that fit
    assert n > 0 and first == [objective.cls, *passage[:n], objective.sep, *question, objective.sep]


def test_closed_book_is_the_generators_answer_nll(parts):
    objective = _objective(parts, k=0)
    batch = objective.collate(rag_examples(objective.retriever, parts[1][:3]))
    ids, mask = objective.generator_inputs(batch, None)
    hidden = objective.model(ids, mask, decoder_input_ids=batch["decoder_input_ids"],
                             decoder_attention_mask=batch["decoder_attention_mask"],
                             run_heads=False).last_hidden_state
    logp = F.log_softmax(objective.lm(hidden).float(), -1)
    labels = batch["labels"]
    token = logp.gather(-1, labels.clamp(min=0)[..., None]).squeeze(-1) * (labels != -100)
    assert torch.allclose(objective(batch).loss, -token.sum(-1).mean(), atol=1e-5)


def test_the_gradient_reaches_the_question_encoder_and_answers_decode(parts):
    objective = _objective(parts, k=3).train()
    batch = objective.collate(rag_examples(objective.retriever, parts[1][:4]))
    objective(batch).loss.backward()
    grads = [p.grad for p in objective.question_encoder.parameters() if p.grad is not None]
    assert grads and sum(float(g.abs().sum()) for g in grads) > 0
    assert not objective.passages.requires_grad  # the index stays fixed
    answers = objective.answer(batch, max_new_tokens=3)
    assert len(answers) == 4 and all(len(a) <= 3 for a in answers)
    assert 0.0 <= exact_match_rate(objective, parts[1][:4], max_new_tokens=2) <= 1.0


def test_a_hyphenated_answer_matches_by_its_tokens_though_its_decoding_spaces_the_hyphen(parts):
    tok = parts[2]
    ids = tok.encode("Short-breathed", add_special_tokens=False).ids
    assert not exact_match("Short-breathed", tok.decode(ids))  # "short - breathed": text alone misses it
    assert answer_matches(tok, ids, ["Short-breathed"])
    assert not answer_matches(tok, ids[:-1], ["Short-breathed"])


def test_exact_match_rate_counts_generated_gold_tokens(parts, monkeypatch):
    objective = _objective(parts, k=1)
    records = [{**r, "answers": ["Short-breathed"]} for r in parts[1][:2]] + parts[1][2:4]
    gold = objective.retriever.tokenizer.encode("Short-breathed", add_special_tokens=False).ids
    monkeypatch.setattr(objective, "answer",
                        lambda batch, max_new_tokens, **decoding: [gold] * len(batch["source"]))
    assert exact_match_rate(objective, records, batch_size=3) == 0.5


def _copy_task(tok, n: int, titles: int, seed: int) -> tuple:
    """n entries whose passage starts with one of `titles` title tokens, the answer; the question
    holds a key of two tokens only (the title cannot be guessed from it) -> (examples, passage ids)."""
    rng = torch.Generator().manual_seed(seed)
    V, cls, sep = tok.vocab_size, tok.special_id("cls"), tok.special_id("sep")
    title = torch.randint(10, 10 + titles, (n,), generator=rng).tolist()
    keys = torch.randperm((V - 10) ** 2, generator=rng)[:n].tolist()
    examples = [{"question": [cls, 10 + key // (V - 10), 10 + key % (V - 10), sep], "labels": [t, sep],
                 "source": torch.randint(10, V, (3,), generator=rng).tolist()} for key, t in zip(keys, title)]
    return examples, [[t, *torch.randint(10, V, (4,), generator=rng).tolist()] for t in title]


# slow (600 steps): what each step is made of is the faster tests' (the generator's inputs hold the
# question and each retrieved passage, the gradient reaches the question encoder, closed book is the
# answer's NLL); that the steps add up to learning is CI's `make test-slow`
@pytest.mark.slow
def test_the_generator_learns_to_copy_the_retrieved_passages_title_to_questions_it_never_saw(parts):
    tok, titles = parts[2], 8
    examples, texts = _copy_task(tok, 600, titles, seed=0)
    torch.manual_seed(0)
    bert = lmforge.build("bert-base", n_layers=1, d_model=32, n_heads=2, d_ff=64, vocab_size=tok.vocab_size,
                         max_seq_len=64, dropout=0.0, attention_dropout=0.0)  # not trained here: fixed
    retriever = BiEncoder(bert, tok, EncoderOptions(max_length=64))
    with torch.no_grad():  # each question's own vector as its passage's: the top 1 is always the right one
        ids = torch.tensor([e["question"] for e in examples])
        vectors = retriever.embed(ids, torch.ones_like(ids))
    generator = lmforge.build(lmforge.tiny("bart-base"), vocab_size=tok.vocab_size, max_seq_len=64,
                              dropout=0.0, attention_dropout=0.0,
                              decoder_start_token_id=tok.special_id("cls"),
                              pad_token_id=tok.special_id("pad"))
    objective = RAGObjective(generator, retriever, vectors, texts, k=1).train()
    train, held = examples[:-64], examples[-64:]
    optimizer = torch.optim.AdamW([*generator.parameters(), *objective.lm.parameters()], lr=3e-3)
    for _ in range(600):
        loss = objective(objective.collate([train[j]
                                            for j in torch.randint(0, len(train), (16,)).tolist()])).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    objective.eval()
    batch = objective.collate(held)
    assert objective.retrieve(batch)[1][:, 0].tolist() == list(range(len(train), len(examples)))
    with torch.no_grad():  # closed book can do no better than log(titles) on the title of a new question
        assert objective(batch).loss < torch.log(torch.tensor(float(titles)))
    hits = sum(answer == e["labels"][:1] for answer, e in zip(objective.answer(batch, 2), held))
    assert hits / len(held) >= 0.5


def test_a_generator_with_its_own_tokenizer_reads_passages_in_its_pieces(parts):
    passages, records, tok = parts
    small = train_tokenizer([f"{p.title}. {p.text}" for p in passages], "wordpiece", 150)
    objective = _objective(parts, 2, small)
    retriever, generator, vectors = objective.retriever, objective.model, objective.passages
    examples = rag_examples(retriever, records[:2], small)
    assert examples[0]["question"] == retriever.ids(records[0]["question"])  # the question encoder's pieces
    assert examples[0]["source"] == small.encode(records[0]["question"], add_special_tokens=False).ids
    batch = objective.collate(examples)
    ids, _ = objective.generator_inputs(batch, objective.retrieve(batch)[1])
    assert int(ids.max()) < small.vocab_size and torch.isfinite(objective(batch).loss)
    with pytest.raises(ValueError, match="smaller than its tokenizer"):
        RAGObjective(generator, retriever, vectors, [], tokenizer=tok)


def _thorough_by_hand(objective, batch, steps):
    """RAG-Sequence's thorough decoding (Lewis et al. 2020, sec. 2.5) with beams of one, one (question,
    passage) pair at a time in probabilities: each passage's greedy answer is a candidate, and the one of
    highest sum_z p(z | x) prod_i p(y_i | x, z, y_<i) wins (the first drawn on a tie)."""
    doc_logp, rows = objective.retrieve(batch)
    ids, mask = objective.generator_inputs(batch, rows)
    K, start, sep, out = rows.shape[1], objective.start, objective.sep, []

    def probs(i, decoder):  # (len(decoder), V) p(. | x, z, y_<i) of pair i
        n = int(mask[i].sum())
        hidden = objective.model(ids[i:i + 1, :n], mask[i:i + 1, :n],
                                 decoder_input_ids=torch.tensor([decoder]), run_heads=False).last_hidden_state
        return torch.softmax(objective.lm(hidden)[0].double(), -1)

    for b in range(len(rows)):
        candidates = []
        for i in range(b * K, b * K + K):
            y = [start]
            for _ in range(steps):
                y.append(int(probs(i, y)[-1].argmax()))
            y = y[1:y.index(sep) + 1] if sep in y[1:] else y[1:]
            candidates += [y] if y not in candidates else []

        def marginal(y, b=b):
            return sum(float(doc_logp[b, z].exp())
                       * float(probs(b * K + z, [start, *y[:-1]])[range(len(y)), y].prod()) for z in range(K))
        best = max(candidates, key=marginal)
        out.append((best[:-1] if best[-1:] == [sep] else best, len(candidates)))
    return out


def test_rag_sequence_answers_by_thorough_decoding_not_the_token_marginal(parts):
    objective = _objective(parts, k=3)
    torch.manual_seed(3)  # a generator whose passages lead it to different answers
    for p in objective.model.parameters():
        p.data.add_(torch.randn_like(p))
    batch = objective.collate(rag_examples(objective.retriever, parts[1][:4]))
    with torch.no_grad():
        want = _thorough_by_hand(objective, batch, 5)
        objective.kind = "sequence"
        answers = objective.answer(batch, 5)
        objective.kind = "token"
        token_answers = objective.answer(batch, 5)
    assert max(n for _, n in want) > 1  # passages disagree: the marginal decides
    assert answers == [y for y, _ in want]
    assert answers != token_answers  # RAG-Token's greedy answer is another model's


def test_rag_token_answers_are_the_marginals_greedy_tokens_recomputed_in_full(parts):
    """Decoded with the passages encoded once and a KV cache, as a full forward over the prefix gives."""
    from lmforge.retrieval.rag import rag_token_next_log_probs

    objective = _objective(parts, k=3)
    torch.manual_seed(4)
    for p in objective.model.parameters():
        p.data.add_(torch.randn_like(p))
    batch = objective.collate(rag_examples(objective.retriever, parts[1][:4]))
    objective.kind = "token"
    with torch.no_grad():
        doc_logp, rows = objective.retrieve(batch)
        out = torch.full((len(doc_logp), 1), objective.start)
        for _ in range(5):
            logits = objective.logits(batch, rows, out, torch.ones_like(out))[:, :, -1]
            out = torch.cat([out, rag_token_next_log_probs(logits, doc_logp).argmax(-1, keepdim=True)], 1)
        answers = objective.answer(batch, 5)
    sep = objective.sep
    assert answers == [r[:r.index(sep)] if sep in r else r for r in out[:, 1:].tolist()]


@pytest.mark.parametrize("bad, match", [({"k": 10_000}, "k=10000: the index holds"),
                                        ({"kind": "tokens"}, "kind='tokens' is not one of")])
def test_a_k_beyond_the_index_or_an_unknown_kind_is_refused_naming_it(parts, bad, match):
    objective = _objective(parts, k=1)
    with pytest.raises(ValueError, match=match):
        RAGObjective(objective.model, objective.retriever, objective.passages, objective.passage_tokens,
                     **{"k": 1, **bad})
