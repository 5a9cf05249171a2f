import pytest
import torch

import lmforge
from lmforge.analysis import score_probes
from lmforge.analysis.cloze import _masked_rows, _measures, _scores, compare
from lmforge.data import corpus_text
from lmforge.data.probes import probes
from lmforge.heads import attach
from lmforge.tokenizer import train_tokenizer


@pytest.fixture(scope="module")
def tokenizers():
    text = corpus_text(300, seed=0).splitlines()
    return {"bert": train_tokenizer(text, "wordpiece", 600, family="bert"),
            "gpt2": train_tokenizer(text, "bytelevel-bpe", 600, family="gpt2")}


def tiny(preset, tokenizer):
    torch.manual_seed(0)
    model = lmforge.build(preset, n_layers=1, d_model=32, n_heads=2, d_ff=64, vocab_size=tokenizer.vocab_size,
                          max_seq_len=128)
    attach(model, "lm")
    return model.eval()


def test_masked_rows_put_one_mask_per_candidate_piece(tokenizers):
    tok = tokenizers["bert"]
    probe = {"kind": "fact", "text": "Ana was born in [MASK].", "answer": "Tosk",
             "candidates": ["Tosk", "Velmora"]}
    for (ids, positions, target), cand in zip(_masked_rows(tok, probe), probe["candidates"]):
        pieces = tok.encode("in " + cand, add_special_tokens=False).ids[1:]
        assert target == pieces and [ids[p] for p in positions] == [tok.special_id("mask")] * len(pieces)
        assert ids[0] == tok.special_id("cls") and ids[-1] == tok.special_id("sep")
        assert tok.decode(ids[positions[-1] + 1:]) == "."


def test_masked_rows_read_the_sentence_as_a_byte_level_bpe_encodes_it():
    # LAMA keeps the space before the text after the blank: RoBERTa's "Ġand", not "and"
    tok = train_tokenizer(corpus_text(300, seed=0).splitlines(), "bytelevel-bpe", 600, family="roberta")
    probe = {"kind": "fact", "text": "The cat was [MASK] and the dog was big.", "answer": "red",
             "candidates": ["red", "big"]}
    for (ids, positions, target), cand in zip(_masked_rows(tok, probe), probe["candidates"]):
        filled = ids[:positions[0]] + target + ids[positions[-1] + 1:]
        assert filled == tok.encode(probe["text"].replace("[MASK]", cand)).ids


def test_batched_scores_equal_one_at_a_time(tokenizers):
    tok = tokenizers["bert"]
    model = tiny("bert-tiny", tok)
    rows = [r for p in probes(2, seed=1) for r in _masked_rows(tok, p)]
    together = _scores(model, rows, tok.special_id("pad"), causal=False)
    alone = [_scores(model, [r], tok.special_id("pad"), causal=False)[0] for r in rows]
    assert together == pytest.approx(alone, abs=1e-4)


@pytest.mark.parametrize("preset,kind,causal", [("bert-tiny", "bert", False), ("gpt2", "gpt2", True)])
def test_scores_are_the_summed_log_probabilities_of_the_targets(tokenizers, preset, kind, causal):
    from lmforge.analysis.cloze import _causal_rows

    tok = tokenizers[kind]
    model = tiny(preset, tok)
    rows = [r for p in probes(2, seed=3) for r in (_causal_rows if causal else _masked_rows)(tok, p)]
    got = _scores(model, rows, tok.special_id("pad") or 0, causal=causal)
    for (ids, positions, targets), score in zip(rows, got):  # each row alone, unpadded, position by position
        with torch.no_grad():
            hidden = model(torch.tensor([ids]), run_heads=False).last_hidden_state[0]
            logp = model.heads["lm"](hidden).log_softmax(-1)
        expected = sum(float(logp[p - causal, t]) for p, t in zip(positions, targets))
        assert score == pytest.approx(expected, abs=1e-4)


@pytest.mark.parametrize("preset,kind", [("bert-tiny", "bert"), ("gpt2", "gpt2")])
def test_a_model_that_prefers_the_answers_scores_every_probe(tokenizers, preset, kind):
    tok = tokenizers[kind]
    sample = [p for p in probes(4, seed=2) if p["kind"] in ("agreement", "pronoun")]
    untrained = score_probes(tiny(preset, tok), tok, sample)
    assert untrained["all"]["n"] == len(sample) and untrained["all"]["chance"] == pytest.approx(0.5)
    model = tiny(preset, tok)
    for probe in sample:  # rig the LM head: this probe's answer pieces far more likely than anything else
        answer = {t for text in (probe["answer"], " " + probe["answer"])
                  for t in tok.encode(text, add_special_tokens=False).ids}
        boost = torch.zeros(tok.vocab_size)
        boost[list(answer)] = 50.0
        hook = model.heads["lm"].register_forward_hook(lambda module, args, out: out + boost)
        rigged = score_probes(model, tok, [probe])
        hook.remove()
        assert rigged[probe["kind"]]["accuracy"] == rigged["all"]["accuracy"] == 1.0
        assert rigged["all"]["mrr"] == 1.0 and rigged["all"]["margin"] > 10


def test_probes_longer_than_the_model_are_left_out(tokenizers):
    tok = tokenizers["bert"]
    model = tiny("bert-tiny", tok)
    model.config = model.config.replace(max_seq_len=16)  # the limit score_probes reads
    sample = probes(2, seed=0)
    fits = [p for p in sample if max(len(ids) for ids, _, _ in _masked_rows(tok, p)) <= 16]
    assert 0 < len(fits) < len(sample)
    out = score_probes(model, tok, sample)
    assert out["all"]["n"] == len(fits) and "coreference" not in out
    assert score_probes(model, tok, [p for p in sample if p not in fits]) == {}


def test_scoring_leaves_the_model_in_its_mode_even_when_it_fails(tokenizers, monkeypatch):
    import lmforge.analysis.cloze as cloze

    model = tiny("bert-tiny", tokenizers["bert"]).train()  # a pretraining run probed mid-way
    score_probes(model, tokenizers["bert"], probes(1, seed=0))
    assert model.training
    def fail(*args, **kwargs):
        raise RuntimeError("out of memory")

    monkeypatch.setattr(cloze, "_scores", fail)
    with pytest.raises(RuntimeError, match="out of memory"):
        score_probes(model, tokenizers["bert"], probes(1, seed=0))
    assert model.training


def test_encoder_decoders_and_mask_less_tokenizers_are_refused(tokenizers):
    with pytest.raises(ValueError, match="mask token"):
        score_probes(tiny("bert-tiny", tokenizers["gpt2"]), tokenizers["gpt2"], probes(1))
    t5 = lmforge.build("t5-small", n_layers=1, d_model=32, n_heads=2, d_ff=64, vocab_size=100)
    with pytest.raises(ValueError, match="encoders"):
        score_probes(t5, tokenizers["bert"], probes(1))


def test_measures_rank_the_answer_among_the_candidates():
    m = _measures({"a": -1.0, "b": -2.0, "c": -4.0}, "b")
    assert m == pytest.approx({"accuracy": 0.0, "mrr": 0.5, "margin": -2.0 + 2.5, "chance": 1 / 3,
                               "chance_mrr": (1 + 1 / 2 + 1 / 3) / 3})
    assert _measures({"a": -1.0, "b": -3.0}, "a") == pytest.approx(
        {"accuracy": 1.0, "mrr": 1.0, "margin": 2.0, "chance": 0.5, "chance_mrr": 0.75})
    tie = _measures({"a": -1.0, "b": -1.0}, "a")  # a tie is not a win
    assert (tie["accuracy"], tie["mrr"], tie["margin"]) == (0.0, 0.5, 0.0)


def test_scores_come_per_kind_per_group_and_overall(tokenizers):
    tok = tokenizers["bert"]
    sample = probes(3, seed=4)
    out = score_probes(tiny("bert-tiny", tok), tok, sample)
    kinds = list(dict.fromkeys(p["kind"] for p in sample))
    assert list(out) == kinds + ["memory", "context", "all"]
    assert out["all"]["n"] == len(sample) == out["memory"]["n"] + out["context"]["n"]
    assert out["copy"]["chance"] == pytest.approx(1 / 24) and \
        out["agreement"]["chance_mrr"] == pytest.approx(0.75)
    for scores in out.values():
        assert set(scores) == {"accuracy", "mrr", "margin", "margin_se", "chance", "chance_mrr", "n"}
        assert 0 <= scores["accuracy"] <= scores["mrr"] <= 1
    by_kind = sum(out[k]["margin"] * out[k]["n"] for k in kinds) / out["all"]["n"]
    assert out["all"]["margin"] == pytest.approx(by_kind)
    one = [score_probes(tiny("bert-tiny", tok), tok, [p])["all"]["margin"]
           for p in sample if p["kind"] == "copy"]
    spread = torch.tensor(one).std().item() / len(one) ** 0.5
    assert out["copy"]["margin"] == pytest.approx(sum(one) / 3) and \
        out["copy"]["margin_se"] == pytest.approx(spread)
    lines = compare(out, out)
    assert [line.split()[0] for line in lines] == ["context", "memory", "all"] and "MRR" in lines[-1]


def test_a_few_steps_on_a_pattern_raise_the_graded_measures(tokenizers):
    """A tiny masked LM trained to fill in is / are after a subject and an attractor: the margin rises."""
    import random

    from lmforge.data.synthetic import agreement

    tok = tokenizers["bert"]
    held_out = [p for p in probes(16, seed=5) if p["kind"] == "agreement"]
    model = tiny("bert-tiny", tok).train()
    before = score_probes(model, tok, held_out)["all"]
    rng, verbs = random.Random(0), {tok.token_to_id("is"), tok.token_to_id("are")}
    encoded = [tok.encode(agreement(rng)[0]).ids for _ in range(64)]
    ids = torch.full((len(encoded), max(map(len, encoded))), tok.special_id("pad"))
    for row, e in enumerate(encoded):
        ids[row, : len(e)] = torch.tensor(e)
    rows, at = torch.arange(len(ids)), torch.tensor([next(i for i, t in enumerate(e) if t in verbs)
                                                     for e in encoded])
    corrupted, targets = ids.clone(), ids[rows, at]
    corrupted[rows, at] = tok.special_id("mask")
    optimiser, attention = (torch.optim.AdamW(model.parameters(), lr=3e-3),
                            (ids != tok.special_id("pad")).long())
    # 160 steps: at 80 the margin gained ranged 1.4-3.2 over the tokenizer's run-to-run vocabulary
    # orders (huggingface/tokenizers#1794), at 160 2.6-5.2 with accuracy 0.75-1.0 (16 probes)
    for _ in range(160):
        hidden = model(corrupted, attention_mask=attention, run_heads=False).last_hidden_state
        loss = torch.nn.functional.cross_entropy(model.heads["lm"](hidden[rows, at]), targets)
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
    after = score_probes(model, tok, held_out)["all"]
    assert after["margin"] > before["margin"] + 1.5 and after["accuracy"] >= 0.7


def test_a_causal_lm_without_bos_scores_a_blank_at_the_start_of_the_text():
    # lmforge's own bpe has no bos: the first piece, here the candidate's, was left unscored
    from lmforge.analysis.cloze import _causal_rows

    tok = train_tokenizer(corpus_text(300, seed=0).splitlines(), "bpe", 600)
    assert tok.special_id("bos") is None
    probe = {"kind": "fact", "text": "[MASK] is a city.", "answer": "Tosk", "candidates": ["Tosk", "Velmora"]}
    for (ids, positions, targets), cand in zip(_causal_rows(tok, probe), probe["candidates"]):
        pieces = tok.encode(probe["text"].replace("[MASK]", cand), add_special_tokens=False).ids
        assert targets == pieces and [ids[p] for p in positions] == pieces
        assert ids[0] in (tok.special_id("eos"), tok.special_id("sep"))
