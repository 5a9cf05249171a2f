"""/embed's EmbedOptions against a real server, each equal to lmforge.embed with the same options:
Matryoshka dimensions, base64 / int8 / uint8 / binary / ubinary encodings (int8 refused until the
calibration ranges are saved beside the model), prompts from config_sentence_transformers.json, each
input's token count and truncation, chunked long inputs, and batch invariance (bitwise)."""
from __future__ import annotations

import base64

import numpy as np
import pytest
import torch

import lmforge
from tests.serve.conftest import TEXTS


@pytest.fixture
def dirs(embed_dirs) -> dict:
    """plain (prompts by name) and calibrated (int8 ranges saved): tests/serve/conftest.py's embed_dirs."""
    return embed_dirs


@pytest.fixture
def served(server):
    """The session's main server, which serves both (tests/serve/conftest.py)."""
    return server


def _post(served, **body):
    answer = served.client().post("/embed", json=body)
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_every_option_equals_lmforge_embed_with_the_same_options(served, dirs):
    texts = TEXTS[:5]
    cases = [("plain", o) for o in ({"dimensions": 16}, {"encoding_format": "binary"},
                                     {"encoding_format": "ubinary"}, {"prompt": "search: "},
                                     {"normalize": False, "dimensions": 8},
                                     {"max_length": 5, "truncate": True},  # it was refused by /embed alone
                                     {"max_length": 6, "truncate": "chunk"})]
    cases += [("calibrated", {"encoding_format": f, **d})
              for f in ("int8", "uint8") for d in ({}, {"dimensions": 16})]
    for model, options in cases:
        answer = _post(served, model=model, texts=texts, **options)
        offline = lmforge.embed(texts, dirs[model], **options)
        assert answer["encoding_format"] == options.get("encoding_format", "float")
        got = torch.tensor(answer["embeddings"], dtype=offline.dtype)
        assert got.shape == offline.shape
        if offline.is_floating_point():
            torch.testing.assert_close(got, offline, atol=1e-5, rtol=0)
        else:  # a rounding step apart at most where the fp32 value sits on a step's edge
            assert (got.int() - offline.int()).abs().max() <= 1


def test_dimensions_cut_then_renormalise_and_encodings_carry_the_same_vector(served):
    full = torch.tensor(_post(served, model="plain", texts=TEXTS[:3], normalize=False)["embeddings"])
    cut = torch.tensor(_post(served, model="plain", texts=TEXTS[:3], dimensions=8)["embeddings"])
    torch.testing.assert_close(cut, torch.nn.functional.normalize(full[:, :8], dim=-1), atol=1e-5, rtol=0)
    floats = _post(served, model="plain", texts=TEXTS[:3])["embeddings"]
    packed = _post(served, model="plain", texts=TEXTS[:3], encoding_format="base64")["embeddings"]
    bits = _post(served, model="plain", texts=TEXTS[:3], encoding_format="ubinary")
    for vector, text, row in zip(floats, packed, bits["embeddings"]):
        assert np.array_equal(np.frombuffer(base64.b64decode(text), "<f4"), np.asarray(vector, np.float32))
        assert np.array_equal(np.packbits(np.asarray(vector) > 0), np.asarray(row, np.uint8))
    assert bits["dim"] == 32 and len(bits["embeddings"][0]) == 4


def test_prompts_by_name_and_the_answer_counts_tokens_and_truncation(served, dirs):
    named = _post(served, model="plain", texts=["the cat"], prompt_name="query")
    given = _post(served, model="plain", texts=["query: the cat"])
    assert named["embeddings"] == given["embeddings"] and named["tokens"] == given["tokens"]
    long = " ".join(TEXTS[i][:30 + i] for i in range(0, 40, 5))  # no repeating period: windows differ
    cut = _post(served, model="plain", texts=[long, "a dog"], truncate=True)
    assert cut["inputs"][0]["truncated"] and cut["inputs"][0]["tokens"] == 32  # the tokens read
    assert cut["inputs"][1] == {"tokens": 4, "truncated": False, "chunks": 1} and cut["tokens"] == 32 + 4
    chunked = _post(served, model="plain", texts=[long], truncate="chunk")
    assert chunked["inputs"][0]["chunks"] == -(-(chunked["inputs"][0]["tokens"] - 2) // 30) > 1 and \
        not chunked["inputs"][0]["truncated"]
    offline = lmforge.embed([long], dirs["plain"], truncate="chunk")
    torch.testing.assert_close(torch.tensor(chunked["embeddings"]), offline, atol=1e-5, rtol=0)
    assert chunked["embeddings"] != cut["embeddings"][:1]


def test_batch_invariant_vectors_are_bitwise_those_of_the_text_alone(served):
    texts = [TEXTS[i * 5] + " " + " ".join(TEXTS[i % 3][:8 * (i % 3)]) for i in range(32)]  # mixed lengths
    alone = _post(served, model="plain", texts=[texts[5]], batch_invariant=True)["embeddings"][0]
    batch = _post(served, model="plain", texts=texts, batch_invariant=True)["embeddings"]
    assert batch[5] == alone  # JSON floats round-trip float32 exactly: equal lists are equal bits


@pytest.mark.parametrize("body, status, param", [
    ({"encoding_format": "int8"}, 422, "encoding_format"),
    ({"model": "calibrated", "encoding_format": "int8", "dimensions": 8}, 422, "encoding_format"),
    ({"encoding_format": "int4"}, 422, "encoding_format"),
    ({"dimensions": 0}, 422, "dimensions"),
    ({"dimensions": 33}, 422, "dimensions"),
    ({"dimensions": "8"}, 422, "dimensions"),
    ({"prompt_name": "nope"}, 422, "prompt_name"),
    ({"prompt": "a", "prompt_name": "query"}, 422, "prompt_name"),
    ({"prompt": "x" * 5000}, 422, "prompt"),
    ({"truncate": "cut"}, 422, "truncate"),
    ({"max_chunks": 0}, 422, "max_chunks"),
    ({"texts": ["the cat " * 40], "truncate": "chunk", "max_chunks": 1}, 422, "max_chunks"),
    ({"texts": ["the cat " * 40]}, 413, "max_seq_len"),
    ({"texts": ["the cat sat on the mat"], "max_length": 4}, 413, "max_length"),
    ({"max_length": 2}, 422, "max_length"),  # no room beside [CLS] and [SEP]
    ({"max_length": 33}, 422, "max_length"),  # past the model's positions
])
def test_refusals_name_the_field(served, body, status, param):
    answer = served.client().post("/embed", json={"model": "plain", "texts": ["the cat"], **body})
    assert answer.status_code == status, answer.text
    assert answer.json()["error"]["param"] == param
