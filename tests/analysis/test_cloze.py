import pytest
import torch

import lmforge
from lmforge.analysis import score_probes
from lmforge.analysis.cloze import _masked_rows, _scores
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
    probe = {"kind": "fact", "text": "Ana was born in [MASK].", "answer": "Tosk", "candidates": ["Tosk", "Velmora"]}
    for (ids, positions, target), cand in zip(_masked_rows(tok, probe), probe["candidates"]):
        pieces = tok.encode("in " + cand, add_special_tokens=False).ids[1:]
        assert target == pieces and [ids[p] for p in positions] == [tok.special_id("mask")] * len(pieces)
        assert ids[0] == tok.special_id("cls") and ids[-1] == tok.special_id("sep")
        assert tok.decode(ids[positions[-1] + 1:]) == "."


def test_batched_scores_equal_one_at_a_time(tokenizers):
    tok = tokenizers["bert"]
    model = tiny("bert-tiny", tok)
    rows = [r for p in probes(2, seed=1) for r in _masked_rows(tok, p)]
    together = _scores(model, rows, tok.special_id("pad"), causal=False)
    alone = [_scores(model, [r], tok.special_id("pad"), causal=False)[0] for r in rows]
    assert together == pytest.approx(alone, abs=1e-4)


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


def test_encoder_decoders_and_mask_less_tokenizers_are_refused(tokenizers):
    with pytest.raises(ValueError, match="mask token"):
        score_probes(tiny("bert-tiny", tokenizers["gpt2"]), tokenizers["gpt2"], probes(1))
    t5 = lmforge.build("t5-small", n_layers=1, d_model=32, n_heads=2, d_ff=64, vocab_size=100)
    with pytest.raises(ValueError, match="encoders"):
        score_probes(t5, tokenizers["bert"], probes(1))
