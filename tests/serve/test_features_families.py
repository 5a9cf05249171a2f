"""POST /features for every family, against one real server holding them all: RoBERTa (positions offset by
padding_idx + 1), ELECTRA (embedding_size != hidden_size) and T5's encoder (relative position buckets, no
[CLS]) served from tiny Hugging Face checkpoints give HF's hidden states of the same tokens and `lmforge
features`'s answer, to 1e-5 in fp32; an ELMo directory serves through the same route what lmforge.features
gives offline (its tokens are words: counted, limited and cut as words), and nothing else."""
from __future__ import annotations

import json
from itertools import pairwise

import pytest
import torch

import lmforge
from lmforge.cli import main

pytest.importorskip("transformers")
TEXTS = ["the small cat sat on the mat", "a dog", "the old fox  near the river today"]
WEIGHTS = [0.5, -1.0, 2.0]  # a scalar mix of the 3 hidden states every model here has


FAMILIES = ["roberta", "electra", "t5"]


@pytest.fixture
def models(feature_models) -> dict:
    """name -> (directory, the reference: HF's model, or for ELMo lmforge's own): tests/serve/conftest.py."""
    return {name: feature_models[name] for name in (*FAMILIES, "elmo")}


@pytest.fixture
def served(featured):
    """The session's server of every feature model: at most 2 layers and 20000 values a request."""
    return featured


def _offline(path, tmp_path, *flags) -> list:
    """`lmforge features`'s answer for TEXTS."""
    argv = ["features", "--model", str(path), *flags, "--out", str(tmp_path / "cli")]
    assert main(argv + [a for t in TEXTS for a in ("--text", t)]) == 0
    return json.loads((tmp_path / "cli" / "features.json").read_text())["data"]


def _reference_states(reference, ids: list) -> torch.Tensor:
    with torch.no_grad():
        return torch.stack(reference(torch.tensor([ids]), output_hidden_states=True).hidden_states)[:, 0]


@pytest.mark.parametrize("name", FAMILIES)
def test_per_token_features_equal_the_reference_hidden_states_and_the_command(served, models, name, tmp_path):
    answer = served.client().post("/features", json={"model": name, "texts": TEXTS, "layers": "0,-1"})
    assert answer.status_code == 200, answer.text
    offline = _offline(models[name][0], tmp_path, "--layers=0,-1")
    for text, item, cli in zip(TEXTS, answer.json()["data"], offline):  # one batch: padded to the longest
        assert item["layers"] == [0, 2] and not item["truncated"] and item["n_tokens"] == len(item["tokens"])
        tokens = item["tokens"]
        assert all(t["text"] == text[t["start"]:t["end"]] for t in tokens)
        spans = [(t["start"], t["end"]) for t in tokens if t["text"]]  # special tokens cover nothing
        assert spans == sorted(spans) and all(a[1] <= b[0] for a, b in pairwise(spans))
        # every character once (T5's prepended "▁" covers none of the word after it)
        assert "".join(t["text"] for t in tokens).replace(" ", "") == text.replace(" ", "")
        want = _reference_states(models[name][1], [t["id"] for t in tokens])[[0, 2]]
        got = torch.tensor(item["features"])
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(torch.tensor(cli["features"]), got, atol=1e-6, rtol=0)
        assert cli["tokens"] == tokens


@pytest.mark.parametrize("name", FAMILIES)
def test_a_scalar_mix_pooled_equals_the_reference(served, models, name):
    client = served.client()
    ids = client.post("/tokenize", json={"model": name, "text": TEXTS[2]}).json()["ids"]
    states = _reference_states(models[name][1], ids)
    mixed = 0.7 * (torch.softmax(torch.tensor(WEIGHTS), 0)[:, None, None] * states).sum(0)  # (T, d)
    wants = {"mean_max": torch.cat([mixed.mean(0), mixed.max(0).values]), "cls": mixed[0], "sep": mixed[-1]}
    for pooling, want in wants.items():  # cls: the first token, T5's first piece (it has no [CLS])
        answer = client.post("/features", json={"model": name, "texts": TEXTS[1:], "layers": "mix",
                                                "mix_weights": WEIGHTS, "mix_gamma": 0.7,
                                                "pooling": pooling})
        assert answer.status_code == 200, answer.text
        got = torch.tensor(answer.json()["data"][1]["features"][0])
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


POOLED = [{"layers": "1", "pooling": p} for p in ("mean", "max", "mean_max", "cls", "sep")]  # cls, sep: words


@pytest.mark.parametrize("fields", [{"layers": "0,-1"}, {"layers": "mix", "mix_weights": WEIGHTS,
                                                         "mix_gamma": 0.5}, *POOLED])
def test_elmo_serves_what_lmforge_features_gives_offline(served, models, fields):
    answer = served.client().post("/features", json={"model": "elmo", "texts": TEXTS, **fields})
    assert answer.status_code == 200, answer.text
    offline = lmforge.features(TEXTS, models["elmo"][0], **fields)
    for text, item, want in zip(TEXTS, answer.json()["data"], offline):
        assert item["layers"] == want.layers and not item["truncated"]
        assert item["n_tokens"] == len(text.split())
        torch.testing.assert_close(torch.tensor(item["features"]), want.features, atol=1e-6, rtol=0)
        if fields.get("pooling", "none") == "none":
            assert item["tokens"] == want.tokens and [t["text"] for t in item["tokens"]] == text.split()
        else:
            assert "tokens" not in item


def test_elmo_answers_the_command_and_the_reference_words(served, models, tmp_path):
    answer = served.client().post("/features", json={"model": "elmo", "texts": TEXTS, "layers": "mix",
                                                     "pooling": "mean"})
    offline = _offline(models["elmo"][0], tmp_path, "--layers", "mix", "--pooling", "mean")
    for text, item, cli in zip(TEXTS, answer.json()["data"], offline):
        got = torch.tensor(item["features"])
        torch.testing.assert_close(torch.tensor(cli["features"]), got, atol=1e-6, rtol=0)
        states = models["elmo"][1].word_layers([text.split()])[0]  # (3, n_words, 64)
        torch.testing.assert_close(got[0], states.mean(0).mean(0), atol=1e-5, rtol=1e-4)


def test_elmo_counts_words_for_the_limits_and_truncate(served):
    client = served.client()
    long_text = "the cat " * 40  # 80 words, more than the model's max_seq_len=64
    cut = client.post("/features", json={"model": "elmo", "texts": long_text, "layers": "-1",
                                         "truncate": True, "max_length": 5})
    assert cut.status_code == 200, cut.text
    item = cut.json()["data"][0]
    assert item["truncated"] and item["n_tokens"] == 5  # the words read
    assert [t["text"] for t in item["tokens"]] == ["the", "cat", "the", "cat", "the"]
    refusals = [({"texts": long_text}, 413, "max_seq_len"), ({"layers": "all"}, 413, "max_layers"),
                ({"texts": ["the small cat sat"] * 40, "layers": "0,1"}, 413, "max_feature_values"),
                ({"layers": "3"}, 422, "layers"),
                ({"layers": "mix", "mix_weights": [1, 2]}, 422, "mix_weights"),
                ({"texts": ["a cat", "  "]}, 422, "texts"), ({"pooling": "first"}, 422, "pooling")]
    for body, status, param in refusals:
        answer = client.post("/features", json={"model": "elmo", "texts": "the cat", "layers": "0", **body})
        assert (answer.status_code, answer.json()["error"]["param"]) == (status, param), answer.text


def test_elmo_lists_features_alone_and_other_routes_refuse_it(served):
    client = served.client()
    listed = {m["id"]: m["capabilities"] for m in client.get("/v1/models").json()["data"]}
    assert listed["elmo"] == ["features"] and {"embed", "features", "tokenize"} <= set(listed["t5"])
    info = client.get("/info").json()["models"]["elmo"]
    assert (info["architecture"], info["max_tokens"], info["embedding_dim"]) == ("elmo", 64, None)
    for path, body in [("/embed", {"texts": "a cat"}), ("/v1/embeddings", {"input": "a cat"}),
                       ("/tokenize", {"text": "a cat"}), ("/fill_mask", {"text": "a <mask>"}),
                       ("/v1/completions", {"prompt": "a cat"}),
                       ("/rerank", {"query": "a", "documents": ["b"]})]:
        answer = client.post(path, json={"model": "elmo", **body})
        assert answer.status_code == 422 and answer.json()["error"]["param"] == "model", (path, answer.text)
        assert "it can: features" in answer.json()["error"]["message"]
    view = client.get("/attention", params={"model": "elmo", "text": "a cat"})
    assert view.status_code == 422 and "it can: features" in view.json()["error"]["message"]
