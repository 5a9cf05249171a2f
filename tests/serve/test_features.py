"""POST /features against a real server: the chosen layers' states (or their scalar mix, or a pooling)
equal Hugging Face's hidden states of the same tokens and `lmforge features --text`'s answer, to 1e-5 in
fp32; each token's text and offsets; every refusal names its field (422) or limit (413); the spec and
/v1/models list the route and each model's capabilities."""
from __future__ import annotations

import json

import pytest
import torch

from lmforge.cli import main

pytest.importorskip("transformers")
TEXTS = ["the small cat sat on the mat", "a dog", "the old fox near the river today"]


@pytest.fixture
def bert(feature_models):
    """(directory, Hugging Face's BertModel): the session's BERT of 3 layers (tests/serve/conftest.py)."""
    return feature_models["bert"]


@pytest.fixture
def served(featured):
    """The session's server of the feature models, bert the default: at most 2 layers and 20000 values."""
    return featured


def _reference_states(reference, tokens) -> torch.Tensor:
    ids = torch.tensor([[t["id"] for t in tokens]])
    with torch.no_grad():
        return torch.stack(reference(ids, output_hidden_states=True).hidden_states)[:, 0]  # (L + 1, T, d)


def test_per_token_features_equal_the_reference_hidden_states_and_the_command(served, bert, tmp_path):
    answer = served.client().post("/features", json={"model": "bert", "texts": TEXTS, "layers": "-2,0"})
    assert answer.status_code == 200, answer.text
    data = answer.json()["data"]
    argv = ["features", "--model", str(bert[0]), "--layers=-2,0", "--out", str(tmp_path / "cli")]
    assert main(argv + [a for t in TEXTS for a in ("--text", t)]) == 0
    offline = json.loads((tmp_path / "cli" / "features.json").read_text())["data"]
    for text, item, cli in zip(TEXTS, data, offline):
        assert item["layers"] == [0, 2] and not item["truncated"]
        tokens = item["tokens"]
        assert [t["text"] for t in tokens] == [text[t["start"]:t["end"]] for t in tokens]
        assert " ".join(t["text"] for t in tokens if t["text"]) == text  # these words are whole pieces
        want = _reference_states(bert[1], tokens)[[0, 2]]
        got = torch.tensor(item["features"])
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(torch.tensor(cli["features"]), got, atol=1e-6, rtol=0)
        assert cli["tokens"] == tokens


def test_a_scalar_mix_and_the_poolings_equal_the_reference(served, bert):
    weights = [0.5, -1.0, 2.0, 0.0]
    client = served.client()
    for pooling in ("mean", "max", "mean_max", "cls", "sep"):
        answer = client.post("/features", json={"texts": TEXTS[:2], "layers": "mix", "mix_weights": weights,
                                                "mix_gamma": 0.7, "pooling": pooling})
        assert answer.status_code == 200, answer.text
        for item in answer.json()["data"]:
            assert item["layers"] == "mix" and "tokens" not in item
            ids = client.post("/tokenize", json={"text": TEXTS[0 if item["index"] == 0 else 1]}).json()["ids"]
            states = _reference_states(bert[1], [{"id": i} for i in ids])
            mixed = 0.7 * (torch.softmax(torch.tensor(weights), 0)[:, None, None] * states).sum(0)  # (T, d)
            want = {"mean": mixed.mean(0), "max": mixed.max(0).values, "cls": mixed[0], "sep": mixed[-1],
                    "mean_max": torch.cat([mixed.mean(0), mixed.max(0).values])}[pooling]
            torch.testing.assert_close(torch.tensor(item["features"][0]), want, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("body, status, param", [
    ({"layers": "4"}, 422, "layers"),
    ({"layers": "x"}, 422, "layers"),
    ({"layers": True}, 422, "layers"),
    ({"layers": "0,0,0"}, 422, "layers"),  # answered one layer, silently
    ({"layers": "mix", "mix_weights": [1, 2]}, 422, "mix_weights"),
    ({"layers": "0", "mix_weights": [1, 2, 3, 4]}, 422, "mix_weights"),
    ({"layers": "mix", "mix_gamma": 1e9}, 422, "mix_gamma"),
    ({"pooling": "first"}, 422, "pooling"),
    ({"pooling": "median"}, 422, "pooling"),
    ({"max_length": 1}, 422, "max_length"),
    ({"max_length": "8"}, 422, "max_length"),
    ({"layers": "1,-1"}, 200, None),
    ({"layers": "all"}, 413, "max_layers"),
    ({"layers": "0-2"}, 413, "max_layers"),
    ({"texts": ["the small cat sat on the mat"] * 40, "layers": "0,1"}, 413, "max_feature_values"),
    ({"texts": "the cat " * 100}, 413, "max_seq_len"),
    ({"unknown": 1}, 422, "unknown"),
])
def test_refusals_name_the_field_or_the_limit(served, body, status, param):
    answer = served.client().post("/features", json={"texts": "the cat", "layers": "0", **body})
    assert answer.status_code == status, answer.text
    if param:
        assert answer.json()["error"]["param"] == param


def test_truncate_cuts_and_says_so(served):
    answer = served.client().post("/features", json={"texts": "the cat " * 100, "layers": "-1",
                                                     "truncate": True, "max_length": 16, "pooling": "mean"})
    assert answer.status_code == 200, answer.text
    item = answer.json()["data"][0]
    assert item["truncated"] and item["n_tokens"] == 16 and len(item["features"][0]) == 32


def test_the_spec_lists_the_routes_and_the_model_list_its_capabilities(served):
    client = served.client()
    spec = client.get("/openapi.json").json()
    for path in ("/features", "/embed", "/v1/models"):
        assert path in spec["paths"]
    fields = spec["components"]["schemas"]["FeaturesRequest"]["properties"]
    assert {"layers", "mix_weights", "mix_gamma", "pooling", "max_length", "truncate", "texts"} <= set(fields)
    assert fields["pooling"]["enum"][:2] == ["none", "mean"]
    # a list option's bounds are its items' and its count, in the array's branch of the Optional
    array = next(branch for branch in fields["mix_weights"]["anyOf"] if branch.get("type") == "array")
    assert array["items"] == {"type": "number", "minimum": -100.0, "maximum": 100.0}
    assert array["minItems"] == 1 and array["maxItems"] >= 13 and "minimum" not in fields["mix_weights"]
    listed = client.get("/v1/models").json()["data"]
    assert listed[0]["id"] == "bert" and {"embed", "features"} <= set(listed[0]["capabilities"])


def test_a_blank_text_is_refused_naming_texts_as_the_library_refuses_it(local):
    """An encoder answered a blank text with [CLS] [SEP]'s features (200), a decoder said "text 1 has no
    tokens"; lmforge.features and `lmforge features --text` refuse it, so every model is refused alike."""
    for model in ("enc", "gen"):
        answer = local.post("/features", json={"model": model, "texts": ["the cat", " "], "pooling": "mean"})
        assert answer.status_code == 422, answer.text
        error = answer.json()["error"]
        assert error["param"] == "texts"
        assert "the text to take features of is empty (texts[1])" in error["message"]
