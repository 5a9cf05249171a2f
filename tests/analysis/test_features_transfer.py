"""Feature-based transfer: a scalar mix and a head on frozen features learn tagging and classification,
seeded, scored with seqeval for BIO tags, and the model's weights never change."""
import random

import pytest
import torch

from lmforge.analysis.feature_transfer import is_bio, transfer
from lmforge.analysis.probe_fit import FitConfig
from tests.tasks.core import tiny, tokenizer

FAST = FitConfig(epochs=25, lr=1e-2, batch_size=32, patience=5)
NAMES = ["John", "Mary", "Anna", "Peter"]
WORDS = ["it", "is", "great", "and", "I", "love", "the", "product", "works", "broke"]


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def tagged(n: int, seed: int) -> list:
    """Sentences whose names are one-word entities (B-PER), other words O."""
    rng, out = random.Random(seed), []
    for _ in range(n):
        words, tags = [], []
        for _ in range(rng.randint(3, 8)):
            if rng.random() < 0.3:
                words.append(rng.choice(NAMES))
                tags.append("B-PER")
            else:
                words.append(rng.choice(WORDS))
                tags.append("O")
        out.append({"words": words, "tags": tags})
    return out


def texts(n: int, seed: int) -> list:
    rng = random.Random(seed)
    return [{"text": f"{rng.choice(WORDS)} it is {cue} {rng.choice(WORDS)}", "label": label}
            for cue, label in (rng.choice([("superb", "pos"), ("flimsy", "neg")]) for _ in range(n))]


def test_a_tagging_head_on_frozen_features_learns_the_tags():
    model, tok = tiny("bert-base").eval(), tokenizer("bert")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    splits = {"train": tagged(80, 0), "dev": tagged(20, 1), "test": tagged(20, 2)}
    out = transfer(model, tok, "tagging", splits, layers="mix", config=FAST, seed=0)
    assert set(out["dev"]) == {"f1", "precision", "recall", "accuracy"}  # BIO: entity scores (seqeval)
    assert out["dev"]["f1"] > 0.8 and out["test"]["accuracy"] > 0.9
    assert len(out["mix_weights"]) == model.config.n_layers + 1 and \
        sum(out["mix_weights"]) == pytest.approx(1.0)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # frozen
    again = transfer(model, tok, "tagging", splits, layers="mix", config=FAST, seed=0)
    assert again == out


def test_a_classification_head_on_mean_pooled_words_learns_the_labels():
    model, tok = tiny("gpt2").eval(), tokenizer("gpt2")
    splits = {"train": texts(60, 0), "dev": texts(20, 1)}
    out = transfer(model, tok, "classification", splits, layers="1-2", head="mlp", config=FAST, seed=0)
    assert set(out["dev"]) == {"accuracy", "f1", "matthews"} and out["dev"]["accuracy"] > 0.8
    assert len(out["mix_weights"]) == 2 and out["labels"] == ["neg", "pos"]


def test_tags_that_are_not_chunks_are_scored_per_word():
    model, tok = tiny("bert-base").eval(), tokenizer("bert")
    pos = [{"words": r["words"], "tags": ["PROPN" if t != "O" else "X" for t in r["tags"]]}
           for r in tagged(40, 3)]
    out = transfer(model, tok, "tagging", {"train": pos[:30], "dev": pos[30:]}, layers=0, config=FAST)
    assert set(out["dev"]) == {"accuracy", "f1"} and out["dev"]["accuracy"] > 0.8


def test_a_label_never_seen_in_training_is_an_error_naming_the_split():
    model, tok = tiny("bert-base").eval(), tokenizer("bert")
    dev = [{"words": ["it"], "tags": ["B-LOC"]}]
    with pytest.raises(ValueError, match="dev: label.*B-LOC"):
        transfer(model, tok, "tagging", {"train": tagged(5, 0), "dev": dev}, config=FAST)
    with pytest.raises(ValueError, match="^kind 'parsing'"):
        transfer(model, tok, "parsing", {"train": tagged(5, 0), "dev": dev})


def test_bio_detection():
    assert is_bio(["O", "B-PER", "I-PER"]) and is_bio(["S-LOC", "O"])
    assert not is_bio(["NOUN", "VERB"]) and not is_bio(["O", "O"])


def test_an_unknown_kind_is_named_as_the_field_kind():
    """transfer(kind="ner") said "--task 'ner' ...", a flag the Python caller never gave: the field, kind."""
    from lmforge.config.options import OptionsError

    with pytest.raises(OptionsError) as caught:
        transfer(tiny("bert-base").eval(), tokenizer("bert"), "ner", {"train": tagged(4, 0),
                                                                      "dev": tagged(2, 1)})
    assert str(caught.value).startswith("kind 'ner' is not one of tagging, classification")
    assert caught.value.field == "kind"
