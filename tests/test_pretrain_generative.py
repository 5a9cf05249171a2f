"""`lmforge pretrain` with the decoder and encoder-decoder objectives on the built-in corpus."""
import json

import pytest
import torch

import lmforge
from lmforge.cli import main
from lmforge.train.pretrain import pretrain
from lmforge.tokenizer import load_tokenizer
from lmforge.train import TrainConfig

TINY = dict(n_layers=1, d_model=32, n_heads=2, d_ff=64, max_seq_len=64)
pytestmark = pytest.mark.usefixtures("few_probes")  # tests/conftest.py


def _losses(out):
    return [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow  # four end-to-end pretraining runs: ~10 s of the default suite
@pytest.mark.parametrize("objective,preset", [("prefix-lm", "gpt2"), ("prefix-lm", "t5-small"),
                                              ("span-corruption", "t5-small"), ("denoising", "bart-base")])
def test_loss_falls_on_the_builtin_corpus(tmp_path, objective, preset):
    train = TrainConfig(steps=30, batch_size=8, lr=1e-2, warmup=5, log_every=1, progress=False)
    model = pretrain(objective, tmp_path, train, preset=preset, n_docs=100,
                     overrides={**TINY, "vocab_size": 300}, log=lambda *a: None)
    losses = _losses(tmp_path)
    assert sum(losses[-5:]) / 5 < 0.85 * sum(losses[:5]) / 5
    kept, tok = lmforge.load(tmp_path / "final"), load_tokenizer(tmp_path / "final")
    assert list(kept.heads) == ["lm"] and kept.config.eos_token_id == tok.eos_id is not None
    if model.config.architecture == "encoder-decoder":  # T5 starts decoding at <pad>, BART at </s>
        start = tok.pad_id if objective == "span-corruption" else tok.eos_id
        assert kept.config.decoder_start_token_id == start
        out = lmforge.generate(kept, torch.tensor([tok.encode("Tosk is a city.").ids]), max_new_tokens=3)
        assert out[0, 0] == start


def test_cli_choices_and_architecture_check(tmp_path, capsys):
    args = ["pretrain", "--preset", "t5-small", "--objective", "span-corruption",
            "--out", str(tmp_path / "t5"), "--steps", "1", "batch_size=2", "progress=false", "n_docs=100",
            *[f"{k}={v}" for k, v in TINY.items()]]
    assert main(args) == 0
    assert load_tokenizer(tmp_path / "t5" / "final").token_to_id("<extra_id_0>") is not None
    for objective, preset in [("span-corruption", "gpt2"), ("denoising", "bert-tiny"), ("clm", "t5-small")]:
        assert main(["pretrain", "--preset", preset, "--objective", objective,
                     "--out", str(tmp_path / "x")]) == 2
        assert "does not fit" in capsys.readouterr().err
