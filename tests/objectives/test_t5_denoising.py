"""T5's BERT-style and deshuffling objectives: the noises' statistics and layout, the whole text as target."""
from __future__ import annotations

import torch

from lmforge.objectives.t5_denoising import bert_style, deshuffle

MASK, V = 999, 500


def test_bert_style_corrupts_fifteen_percent_ninety_of_them_to_the_mask():
    tokens = list(range(1, 401))
    masked = randoms = 0
    for seed in range(50):
        out = bert_style(tokens, torch.Generator().manual_seed(seed), MASK, V)
        assert len(out) == len(tokens)
        changed = [i for i, (a, b) in enumerate(zip(tokens, out)) if a != b or b == MASK]
        masked += sum(out[i] == MASK for i in changed)
        randoms += sum(out[i] != MASK for i in changed)
    total = 50 * 400
    assert abs((masked + randoms) / total - 0.15) < 0.01  # a random token may equal the original: rare
    assert abs(masked / (masked + randoms) - 0.9) < 0.02


def test_deshuffling_is_a_seeded_permutation():
    tokens = list(range(30))
    a = deshuffle(tokens, torch.Generator().manual_seed(1))
    assert sorted(a) == tokens and a != tokens
    assert a == deshuffle(tokens, torch.Generator().manual_seed(1))


def test_the_objectives_target_the_whole_original_text():
    from lmforge import objectives
    from lmforge.data.synthetic import documents
    from lmforge.model import from_config
    from lmforge.presets import get_config
    from lmforge.train.pretrain import default_tokenizer, special_token_ids

    tok = default_tokenizer("t5", list(documents(40, seed=0)), 300)
    cfg = get_config("t5-small", n_layers=1, d_model=32, n_heads=2, d_ff=64, vocab_size=tok.vocab_size)
    cfg = cfg.replace(**special_token_ids(tok, "encoder-decoder"))
    for name in ("t5-bert-style", "t5-deshuffling"):
        objective = objectives.get(name).make(from_config(cfg), tok)
        ids = list(range(10, 40)) + [tok.special_id("eos")]
        out = objective.corrupt({"input_ids": ids}, torch.Generator().manual_seed(0))
        assert out["labels"] == ids and len(out["input_ids"]) == len(ids) and out["input_ids"] != ids
        assert out["input_ids"][-1] == tok.special_id("eos")  # </s> stays in place
        loss = objective(objective.collate([out]))
        assert torch.isfinite(loss.loss)
