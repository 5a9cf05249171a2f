"""A text's token count is the tokens the model read, on every face: lmforge.features' n_tokens and
SentenceEncoder.embed_with's tokens (lmforge.embed's) equal POST /features' n_tokens and POST /embed's
inputs[].tokens, for a short text and for one far over max_length cut by truncate (the server reads only a
long text's head: it once said 158 tokens where Python said 272)."""
from __future__ import annotations

import pytest

import lmforge
from lmforge.pipelines.embed import EmbedOptions, SentenceEncoder

fastapi = pytest.importorskip("fastapi")


SHORT = "the cat"  # within max_length=5: [CLS] the cat [SEP]
LONG = "the small cat sat on the red mat near the river today " * 30  # 362 tokens, 1650 characters


@pytest.fixture(scope="module")
def faces(tiny_embedder):
    """(model directory, a client of the server's app on that model)."""
    return tiny_embedder


@pytest.mark.parametrize("max_length", [5, 7])
def test_features_count_the_tokens_read_alike(faces, max_length):
    path, client = faces
    asked = {"max_length": max_length, "truncate": True, "pooling": "mean", "layers": "-1"}
    answer = client.post("/features", json={"texts": [LONG, SHORT], **asked})
    assert answer.status_code == 200, answer.text
    served = [(d["n_tokens"], d["truncated"]) for d in answer.json()["data"]]
    found = lmforge.features([LONG, SHORT], path, **asked)
    assert [(f.n_tokens, f.truncated) for f in found] == served
    assert served[0] == (max_length, True) and not served[1][1] and served[1][0] <= max_length


@pytest.mark.parametrize("max_length", [5, 7])
def test_embed_counts_the_tokens_read_alike(faces, max_length):
    path, client = faces
    answer = client.post("/embed", json={"texts": [LONG, SHORT], "max_length": max_length, "truncate": True})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    served = [(i["tokens"], i["truncated"]) for i in body["inputs"]]
    found = SentenceEncoder.from_dir(path).embed_with([LONG, SHORT],
                                                      EmbedOptions(max_length=max_length, truncate=True))
    assert list(zip(found.tokens, found.truncated)) == served
    assert served[0] == (max_length, True) and body["tokens"] == sum(found.tokens)


def test_a_chunked_text_counts_all_its_tokens_alike(faces):
    path, client = faces
    text = " ".join(LONG.split()[:40])
    answer = client.post("/embed", json={"texts": [text], "max_length": 8, "truncate": "chunk",
                                         "max_chunks": 64})
    assert answer.status_code == 200, answer.text
    found = SentenceEncoder.from_dir(path).embed_with([text], EmbedOptions(max_length=8, truncate="chunk",
                                                                           max_chunks=64))
    assert answer.json()["inputs"][0]["tokens"] == found.tokens[0] > 8 and found.chunks[0] > 1
