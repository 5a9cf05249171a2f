"""POST /rerank and /v1/rerank against a real server: the same order and scores as `lmforge.rerank` offline,
top_n and return_documents, truncation said per document, and every refusal naming its field (422) or its
limit (413); the spec and /v1/models list the routes and the capability."""
from __future__ import annotations

import pytest

import lmforge
from lmforge.config.options import OptionsError
from tests.serve.conftest import TEXTS

QUERY = "the small cat sat on the mat"
DOCS = TEXTS[:6] + ["a dog", "the old fox near the river today"]


@pytest.fixture
def dirs(ranked_dirs) -> dict:
    """The session's reranker (rr) and plain encoder (plain): tests/serve/conftest.py."""
    return ranked_dirs


@pytest.fixture
def served(ranked):
    """The session's server of them: 8 documents and 170 tokens a request, 3 items a batch."""
    return ranked


def test_rerank_gives_the_offline_order_and_scores(served, dirs):
    documents = [d if i % 2 else {"text": d} for i, d in enumerate(DOCS)]
    answer = served.client().post("/rerank", json={"query": QUERY, "documents": documents})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    offline = lmforge.rerank(dirs["rr"], QUERY, DOCS)
    assert [r["index"] for r in body["results"]] == [i for i, _ in offline]  # split into 3 jobs, batched
    assert [r["relevance_score"] for r in body["results"]] == pytest.approx([s for _, s in offline], abs=1e-5)
    assert body["model"] == "rr" and not any(r["truncated"] for r in body["results"])
    assert "document" not in body["results"][0] and body["usage"]["total_tokens"] > len(DOCS)
    assert len({s for _, s in offline}) == len(DOCS)  # distinct scores: the order is a real one


def test_v1_rerank_top_n_and_documents(served, dirs):
    answer = served.client().post("/v1/rerank", json={"model": "rr", "query": QUERY, "documents": DOCS,
                                                     "top_n": 2, "return_documents": True})
    assert answer.status_code == 200, answer.text
    results = answer.json()["results"]
    best = lmforge.rerank(dirs["rr"], QUERY, DOCS, top_n=2)
    assert [r["index"] for r in results] == [i for i, _ in best]
    assert [r["document"]["text"] for r in results] == [DOCS[i] for i, _ in best]


def test_truncation_is_said_per_document_or_refused(served, dirs):
    long = " ".join(["the old fox near the river"] * 20)
    answer = served.client().post("/rerank", json={"query": QUERY, "documents": ["a dog", long]})
    assert answer.status_code == 200, answer.text
    assert {r["index"]: r["truncated"] for r in answer.json()["results"]} == {0: False, 1: True}
    assert [r["index"] for r in answer.json()["results"]] == [i for i, _ in lmforge.rerank(dirs["rr"], QUERY,
                                                                                           ["a dog", long])]
    refused = served.client().post("/rerank", json={"query": QUERY, "documents": ["a dog", long],
                                                    "truncate": False})
    assert refused.status_code == 413 and refused.json()["error"]["param"] == "max_seq_len"
    assert "documents.1" in refused.json()["error"]["message"]
    with pytest.raises(OptionsError, match="document 1 makes") as err:
        lmforge.rerank(dirs["rr"], QUERY, ["a dog", long], truncate=False)
    assert err.value.field == "truncate"


@pytest.mark.parametrize("body,status,param", [
    ({"query": QUERY, "documents": ["a dog"] * 9}, 413, "max_documents"),
    ({"query": QUERY, "documents": [" ".join(["fox river"] * 9)] * 8}, 413, "max_request_tokens"),
    ({"query": QUERY, "documents": []}, 422, "documents"),
    ({"query": " ", "documents": ["a dog"]}, 422, "query"),
    ({"query": QUERY, "documents": ["a dog"], "top_n": 0}, 422, "top_n"),
    ({"query": QUERY, "documents": ["a dog"], "top_n": "2"}, 422, "top_n"),
    ({"query": QUERY, "documents": [{"txt": "a dog"}]}, 422, "documents.0.text"),
    # each names the field at fault (they were documents.0 and the string form's "a valid string")
    ({"query": QUERY, "documents": [{"text": None}]}, 422, "documents.0.text"),
    ({"query": QUERY, "documents": [{"text": "a", "title": "b"}]}, 422, "documents.0.title"),
    ({"query": QUERY, "documents": ["a dog"], "rank_fields": ["x"]}, 422, "rank_fields"),
    ({"documents": ["a dog"]}, 422, "query"),
    ({"model": "plain", "query": QUERY, "documents": ["a dog"]}, 422, "model"),
    ({"model": "nope", "query": QUERY, "documents": ["a dog"]}, 404, "model"),
])
def test_refusals_name_the_field_or_limit(served, body, status, param):
    answer = served.client().post("/rerank", json=body)
    assert answer.status_code == status, answer.text
    assert answer.json()["error"]["param"] == param


def test_spec_and_model_list(served):
    client = served.client()
    spec = client.get("/openapi.json").json()
    assert {"/rerank", "/v1/rerank"} <= set(spec["paths"])
    fields = spec["components"]["schemas"]["RerankRequest"]["properties"]  # what the refusals above hold to
    assert fields["documents"]["minItems"] == 1 and fields["query"]["pattern"] == r"\S"
    capabilities = {m["id"]: m["capabilities"] for m in client.get("/v1/models").json()["data"]}
    assert "rerank" in capabilities["rr"] and "predict" not in capabilities["rr"]
    assert "rerank" not in capabilities["plain"]


def test_a_long_query_is_tokenized_once_per_pair_only_as_far_as_a_pair_reads_it(dirs):
    """Each document's (query, document) pair was tokenized with the query's whole head, max_len x 128
    characters: 1,024 documents and a 64 KB query held a 512-token reranker's server for 39 s before its 413.
    Now the pairs carry the query's first max_len tokens (and 128 characters): the same order and scores."""
    from fastapi.testclient import TestClient

    from lmforge.serve.app import create_app
    from lmforge.serve.models import load_served

    served = load_served("rr", dirs["rr"])
    counted, count = [], served.count
    served.count = lambda texts, pairs=None: counted.extend(map(len, texts)) or count(texts, pairs)
    query = " ".join(["the old fox near the river"] * 200)  # 1,200 words; max_len 24
    with TestClient(create_app({"rr": served}, threads=1)) as client:
        answer = client.post("/rerank", json={"query": query, "documents": DOCS[:4]})
    assert answer.status_code == 200, answer.text
    assert counted and max(counted) <= 24 * 8 + 128 < len(query)  # not 24 x 128 characters each
    offline = lmforge.rerank(dirs["rr"], query, DOCS[:4])
    assert [r["index"] for r in answer.json()["results"]] == [i for i, _ in offline]
    assert [r["relevance_score"] for r in answer.json()["results"]] == pytest.approx([s for _, s in offline],
                                                                                   abs=1e-6)


def test_a_long_query_of_few_tokens_is_read_as_lmforge_rerank_reads_it(dirs):
    """The query's head was cut mid-word at max_len x 128 characters: 16 words of 200 characters (16 [UNK],
    the pair fits) became 15 [UNK] and 57 pieces of the cut word, scored truncated, unlike lmforge.rerank;
    the head now ends at a whole word (limits.text_head), so the pair is read as offline."""
    from fastapi.testclient import TestClient

    from lmforge.serve.app import create_app
    from lmforge.serve.models import load_served

    query, documents = ("a" * 200 + " ") * 16, ["a dog", "the cat"]
    assert len(query) > 24 * 128  # the head's room: max_len 24
    with TestClient(create_app({"rr": load_served("rr", dirs["rr"])}, threads=1)) as client:
        answer = client.post("/rerank", json={"query": query, "documents": documents, "truncate": False})
    assert answer.status_code == 200, answer.text
    offline = lmforge.rerank(dirs["rr"], query, documents, truncate=False)
    assert not any(r["truncated"] for r in answer.json()["results"])
    assert [r["index"] for r in answer.json()["results"]] == [i for i, _ in offline]
    assert [r["relevance_score"] for r in answer.json()["results"]] == pytest.approx([s for _, s in offline],
                                                                                   abs=1e-6)


def test_a_query_or_document_mostly_whitespace_is_read_whole_as_lmforge_rerank_reads_it(dirs):
    """A text whose first max_len x 128 characters are whitespace was read as its head alone, nothing: the
    pairs were counted and scored without the query's (or the document's) words, unlike lmforge.rerank; as
    /embed's texts (clip), a long text whose head holds few tokens is read whole."""
    from fastapi.testclient import TestClient

    from lmforge.serve.app import create_app
    from lmforge.serve.models import load_served

    served, pad = load_served("rr", dirs["rr"]), " " * (24 * 128)  # the head's room: max_len 24
    long = " ".join([QUERY] * 10)  # past max_len: the pair keeps as much of the document as offline
    for query, documents in ((pad + QUERY, DOCS[:4]), (QUERY, [pad + "a dog", *DOCS[:3]]),
                             (long, [pad + "a dog", *DOCS[:3]])):
        with TestClient(create_app({"rr": served}, threads=1)) as client:
            answer = client.post("/rerank", json={"query": query, "documents": documents, "truncate": True})
        assert answer.status_code == 200, answer.text
        whole = sum(min(len(served.front.encode(query, d).ids), 24) for d in documents)
        assert answer.json()["usage"]["prompt_tokens"] == whole
        offline = lmforge.rerank(dirs["rr"], query, documents, truncate=True)
        assert [r["index"] for r in answer.json()["results"]] == [i for i, _ in offline]
        assert [r["relevance_score"] for r in answer.json()["results"]] == pytest.approx(
            [s for _, s in offline], abs=1e-6)
