"""POST /embed counts a lowercasing model's texts as the model reads them (lowercased), as lmforge.embed
counts them: counted as sent, a cased tokenizer's text of 14 tokens read was a 413 of 44."""
from __future__ import annotations

import json

import pytest
import torch

from lmforge.pipelines.embed_options import EmbedOptions
from tests.serve.conftest import _save, _tiny, _tokenizer

fastapi = pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from lmforge.serve import create_app, load_served  # noqa: E402

TEXT = "THE SMALL CAT SAT ON THE MAT " * 2  # the byte-level BPE's capitals: 44 tokens as sent, 14 lowered


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """An encoder of 32 positions with a cased (byte-level BPE) tokenizer, which its config lowercases."""
    tokenizer = _tokenizer("gpt2")
    path = _save(_tiny("bert-base", tokenizer, 7, max_seq_len=32), tokenizer, tmp_path_factory.mktemp("lc"))
    (path / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 32, "do_lower_case": True}))
    return path


@pytest.mark.parametrize("truncate", [False, True, "chunk"])
def test_served_counts_and_vectors_of_a_lowercasing_model_are_lmforge_embeds(model_dir, truncate):
    served = load_served("e", model_dir)
    assert len(served.front.encode(TEXT).ids) > 32 >= len(served.front.encode(TEXT.lower()).ids)
    with TestClient(create_app({"e": served}, threads=1)) as client:
        answer = client.post("/embed", json={"model": "e", "texts": [TEXT], "truncate": truncate})
    assert answer.status_code == 200, answer.text
    found = served.encoder.embed_with([TEXT], EmbedOptions(truncate=truncate))
    assert answer.json()["tokens"] == found.tokens[0] == answer.json()["inputs"][0]["tokens"]
    assert answer.json()["inputs"][0]["truncated"] is False
    assert torch.allclose(torch.tensor(answer.json()["embeddings"]), found.vectors, atol=1e-5)


def test_a_cased_prompt_and_text_are_lowered_once_on_the_route_and_embed_as_lmforge_embed(model_dir):
    """The route lowers prompt + text once (to count them); the worker's embed_counted reads them as sent."""
    import lmforge

    served = load_served("e", model_dir)
    sent, real = [], served.encoder.embed_counted
    served.encoder.embed_counted = lambda texts, *args: sent.append(list(texts)) or real(texts, *args)
    with TestClient(create_app({"e": served}, threads=1)) as client:
        answer = client.post("/embed", json={"model": "e", "texts": ["The CAT sat"], "prompt": "Query: "})
    assert answer.status_code == 200, answer.text
    assert sent == [["query: the cat sat"]]  # one text: this tokenizer has no pad token
    ours = lmforge.embed(["The CAT sat"], model=served.encoder, prompt="Query: ")
    assert torch.equal(torch.tensor(answer.json()["embeddings"]), ours)  # one text alone: the same pass
