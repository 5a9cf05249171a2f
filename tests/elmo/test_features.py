"""ELMo as a frozen feature extractor: the scalar mix over its layers (eq. 1), and `lmforge features`
with tagging and classification heads on an ELMo directory, with or without a word tokenizer."""
import json
import random

import pytest
import torch

import lmforge
from lmforge.analysis.features import load_features
from lmforge.cli import main
from lmforge.data.treebank import treebank_splits
from lmforge.layers.scalar_mix import ScalarMix
from lmforge.tokenizer.chars import train_words

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def elmo_dir(tmp_path_factory):
    """A tiny randomly initialised ELMo saved without a tokenizer (as `lmforge convert` of AllenNLP files)."""
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("elmo")
    lmforge.build(lmforge.tiny("elmo-small")).save(path)
    return path


@pytest.fixture(scope="module")
def elmo_with_tokenizer(elmo_dir, tmp_path_factory):
    """The same ELMo with a word tokenizer beside it, as a pretrain run's final directory."""
    path = tmp_path_factory.mktemp("elmo-words")
    lmforge.load(elmo_dir).save(path)
    train_words(["the dog sleeps ."] * 3, 20).save(path)  # the softmax's words: the features never use them
    return path


def _jsonl(path, records: list):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def test_the_scalar_mix_over_elmo_layers_is_eq_1_and_trains_only_its_weights(elmo_dir):
    model = lmforge.load(elmo_dir)
    layers = model.word_layers([["the", "dog", "sleeps", "."]])[0]  # (3, 4, 2 d_model)
    mix = ScalarMix(layers.shape[0])
    with torch.no_grad():
        mix.scalars.copy_(torch.tensor([0.5, -1.0, 2.0]))
        mix.gamma.fill_(1.5)
    s = torch.softmax(torch.tensor([0.5, -1.0, 2.0]), 0)
    expected = 1.5 * (s[0] * layers[0] + s[1] * layers[1] + s[2] * layers[2])
    out = mix(layers)
    assert torch.allclose(out, expected, atol=1e-6)
    out.pow(2).sum().backward()
    assert mix.scalars.grad.abs().sum() > 0 and mix.gamma.grad is not None
    assert all(p.grad is None for p in model.parameters())  # the features are frozen


def test_features_tagging_and_data_on_an_elmo_without_tokenizer(elmo_dir, tmp_path):
    before = (elmo_dir / "model.safetensors").read_bytes()
    splits = treebank_splits(120, 0, 0.2)
    files = {k: _jsonl(tmp_path / f"{k}.jsonl", [{"words": r["words"], "tags": r["upos"]} for r in v])
             for k, v in splits.items()}
    out = tmp_path / "tagging"
    assert main(["features", "--model", str(elmo_dir), "--task", "tagging", "--train", files["train"],
                 "--dev", files["dev"], "--test", files["test"], "--data", files["dev"], "--layers", "mix",
                 "--out", str(out), "epochs=20", "lr=0.01"]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    tags = [t for r in splits["test"] for t in r["upos"]]
    majority = max(tags.count(t) for t in set(tags)) / len(tags)
    assert metrics["test"]["accuracy"] > majority + 0.3, (metrics["test"], majority)  # a random ELMo: ~0.7
    assert len(metrics["mix_weights"]) == 3 and sum(metrics["mix_weights"]) == pytest.approx(1.0)
    features, meta = load_features(out / "features.safetensors")
    assert len(features) == len(splits["dev"]) and meta["layers"] == [0, 1, 2]
    assert features[0].shape == (3, len(splits["dev"][0]["words"]), 2 * 32)  # [h->; h<-], d_model 32
    assert (elmo_dir / "model.safetensors").read_bytes() == before  # frozen: the model was never written


def test_features_classification_on_an_elmo_with_its_word_tokenizer(elmo_with_tokenizer, tmp_path):
    path = elmo_with_tokenizer
    rng = random.Random(0)
    words = ["it", "is", "the", "product", "and", "works", "I", "think"]

    def texts(n):
        return [{"text": f"{rng.choice(words)} {cue} {rng.choice(words)}", "label": label}
                for cue, label in (rng.choice([("superb", "pos"), ("flimsy", "neg")]) for _ in range(n))]

    train, dev = _jsonl(tmp_path / "train.jsonl", texts(60)), _jsonl(tmp_path / "dev.jsonl", texts(20))
    out = tmp_path / "cls"
    assert main(["features", "--model", str(path), "--task", "classification", "--train", train, "--dev", dev,
                 "--layers", "0-2", "--out", str(out), "epochs=30", "lr=0.01"]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["dev"]["accuracy"] >= 0.9 and metrics["layers"] == [0, 1, 2]


def test_finetune_points_an_elmo_to_feature_based_use(elmo_with_tokenizer, tmp_path, capsys):
    data = _jsonl(tmp_path / "t.jsonl", [{"words": ["a", "b"], "tags": ["X", "Y"]}] * 4)
    assert main(["finetune", "--model", str(elmo_with_tokenizer), "--task", "tagging", "--train", data,
                 "--out", str(tmp_path / "ft"), "--steps", "1"]) == 2
    err = capsys.readouterr().err
    assert "lmforge features" in err and err.count("\n") == 1
