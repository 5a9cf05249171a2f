"""The Matryoshka loss of DPR training (Kusupati et al. 2022): the weighted sum of the in-batch loss over
nested prefixes of the embeddings, each renormalised; without it the loss is bitwise the plain one; the
option is checked where it is declared and reloads with the retriever."""
from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

import lmforge
from lmforge.config.options import OptionsError
from lmforge.retrieval.dpr import BiEncoder, DPRObjective, EncoderOptions
from lmforge.tokenizer.train import train_tokenizer

TEXTS = (("who is ann", "ann is here", "bob"), ("where is bob", "bob sails far", "ann"),
         ("what sails", "a boat sails", "here is ann"))


@pytest.fixture(scope="module")
def setup():
    tokenizer = train_tokenizer([t for row in TEXTS for t in row] * 4, "wordpiece", 120)
    torch.manual_seed(0)
    model = lmforge.build("bert-base", n_layers=1, d_model=32, n_heads=2, d_ff=64,
                          vocab_size=tokenizer.vocab_size, max_seq_len=32)
    return model, tokenizer


def _objective(setup, **options):
    model, tokenizer = setup
    encoder = BiEncoder(model, tokenizer, EncoderOptions(max_length=32, **options))
    objective = DPRObjective(encoder).eval()
    batch = objective.collate([{"question": encoder.ids(q), "positive": encoder.ids(p),
                                "negatives": [encoder.ids(n)]}
                               for q, p, n in TEXTS])
    return encoder, objective, batch


def _by_hand(encoder, d, normalize=True, temperature=0.05):
    q = encoder.encode([q for q, _, _ in TEXTS])
    p = encoder.encode([p for _, p, _ in TEXTS] + [n for _, _, n in TEXTS])
    q, p = q[:, :d], p[:, :d]
    if normalize:
        q, p = F.normalize(q, dim=-1), F.normalize(p, dim=-1)
        return F.cross_entropy(q @ p.T / temperature, torch.arange(len(q)))
    return F.cross_entropy(q @ p.T, torch.arange(len(q)))


def test_the_loss_is_the_weighted_sum_of_the_per_prefix_losses(setup):
    encoder, objective, batch = _objective(setup, matryoshka_dims=(32, 16, 8, 4))
    out = objective(batch)
    want = sum(_by_hand(encoder, d) for d in (32, 16, 8, 4))
    assert torch.allclose(out.loss, want, atol=1e-4)
    for d in (32, 16, 8, 4):
        assert torch.allclose(out.metrics[f"loss_{d}"], _by_hand(encoder, d), atol=1e-5)
    encoder, objective, batch = _objective(setup, matryoshka_dims=(32, 8), matryoshka_weights=(0.5, 2.0))
    want = 0.5 * _by_hand(encoder, 32) + 2.0 * _by_hand(encoder, 8)
    assert torch.allclose(objective(batch).loss, want, atol=1e-4)


def test_unnormalised_prefixes_are_not_renormalised(setup):
    encoder, objective, batch = _objective(setup, matryoshka_dims=(16, 4), normalize=False)
    want = _by_hand(encoder, 16, normalize=False) + _by_hand(encoder, 4, normalize=False)
    assert torch.allclose(objective(batch).loss, want, rtol=1e-4)


def test_without_matryoshka_or_with_the_whole_width_alone_the_loss_is_bitwise_the_plain_one(setup):
    encoder, objective, batch = _objective(setup)
    q = encoder.embed(batch["input_ids"], batch["attention_mask"])
    p = encoder.embed(batch["p_input_ids"], batch["p_attention_mask"], passage=True)
    logits = (20.0 * q @ p.T).masked_fill(batch["same_passage"], float("-inf"))
    plain = F.cross_entropy(logits, torch.arange(len(q)))  # DPRObjective.forward as it was
    assert torch.equal(objective(batch).loss, plain)
    assert torch.equal(_objective(setup, matryoshka_dims=(32,))[1](batch).loss, plain)


def test_gradients_reach_the_encoder_through_every_prefix(setup):
    _, objective, batch = _objective(setup, matryoshka_dims=(8,))
    objective(batch).loss.backward()
    grads = [p.grad for p in objective.encoder.model.parameters() if p.grad is not None]
    assert grads and any(g.abs().sum() > 0 for g in grads)
    objective.encoder.model.zero_grad(set_to_none=True)


@pytest.mark.parametrize("options, field", [
    (dict(matryoshka_dims=(16, 16)), "matryoshka_dims"),
    (dict(matryoshka_dims=(0,)), "matryoshka_dims"),
    (dict(matryoshka_dims=(8.5,)), "matryoshka_dims"),
    (dict(matryoshka_dims="16"), "matryoshka_dims"),
    (dict(matryoshka_dims=(16, 8), matryoshka_weights=(1.0,)), "matryoshka_weights"),
    (dict(matryoshka_dims=(16,), matryoshka_weights=(float("nan"),)), "matryoshka_weights"),
    (dict(temperature=0.0), "temperature"),
    (dict(pooling="max"), "pooling"),
])
def test_bad_options_name_their_field(options, field):
    with pytest.raises(OptionsError) as err:
        EncoderOptions(**options)
    assert err.value.field == field and field in str(err.value)


def test_prefixes_wider_than_the_model_are_refused_and_the_option_reloads(setup, tmp_path):
    model, tokenizer = setup
    with pytest.raises(OptionsError, match="have 32"):
        BiEncoder(model, tokenizer, EncoderOptions(matryoshka_dims=(64, 32)))
    encoder = BiEncoder(model, tokenizer, EncoderOptions(max_length=32, matryoshka_dims=[32, 8],
                                                         matryoshka_weights=[1, 0.5]))
    assert encoder.options.matryoshka_dims == (32, 8)
    model.save(tmp_path)
    encoder.save(tmp_path)
    assert BiEncoder.from_dir(tmp_path).options == encoder.options


def test_the_command_line_trains_with_it_and_refuses_a_bad_one_naming_the_field(setup, tmp_path, capsys):
    from lmforge.cli import main

    model, tokenizer = setup
    model.save(tmp_path / "tiny")
    tokenizer.save(tmp_path / "tiny")
    base = ["retrieve", "train", "--model", str(tmp_path / "tiny"), "--steps", "2", "batch_size=4",
            "progress=false", "max_length=32"]
    assert main([*base, "--out", str(tmp_path / "bad"), "matryoshka_dims=[64,8]"]) == 2
    assert "matryoshka_dims" in capsys.readouterr().err
    assert main([*base, "--out", str(tmp_path / "run"), "matryoshka_dims=[32,8]",
                 "matryoshka_weights=[1,2]"]) == 0
    saved = BiEncoder.from_dir(tmp_path / "run" / "final").options
    assert saved.matryoshka_dims == (32, 8) and saved.matryoshka_weights == (1, 2)
    logged = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert any("loss_8" in row for row in logged)
