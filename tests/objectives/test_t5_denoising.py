"""T5's BERT-style and deshuffling objectives: the noises' statistics and layout, the whole text as target."""
from __future__ import annotations

import torch

from lmforge.data.synthetic import documents
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
    from lmforge.train.pretrain import special_token_ids
    from lmforge.train.tokenizer_run import default_tokenizer

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


def test_every_input_and_target_ends_in_one_eos():
    # T5 appends </s> to the noised input and to the target; blocks of raw text once went without it
    # (0.2 % of GCIDE blocks ended in one) and held the </s> joining documents mid-target
    from lmforge import objectives
    from lmforge.data.stream import build_examples
    from lmforge.model import from_config
    from lmforge.presets import get_config
    from lmforge.train.pretrain import special_token_ids
    from lmforge.train.tokenizer_run import default_tokenizer

    texts = list(documents(40, seed=0))
    tok = default_tokenizer("t5", texts, 300)
    cfg = get_config("t5-small", n_layers=1, d_model=32, n_heads=2, d_ff=64, vocab_size=tok.vocab_size)
    cfg = cfg.replace(**special_token_ids(tok, "encoder-decoder"))
    docs = [[tok.encode(" ".join(d), add_special_tokens=False).ids] for d in texts]
    eos = tok.special_id("eos")
    for name in ("t5-bert-style", "t5-deshuffling"):
        spec = objectives.get(name)
        objective = spec.make(from_config(cfg), tok)
        examples = build_examples(spec.examples, docs, tok, 32)
        assert len(examples) > 10
        for i, example in enumerate(examples):
            out = objective.corrupt(example, torch.Generator().manual_seed(i))
            assert out["labels"] == example["input_ids"] + [eos] and len(out["input_ids"]) <= 32
            for seq in (out["input_ids"], out["labels"]):
                assert seq.count(eos) == 1 and seq[-1] == eos
