"""Every refusal is true to the request and to /info: a request's generation cost is the sum over its
prompts (and beams) against max_request_tokens; a 413 advises truncate only where following the advice
is served; the limit it names is the one at fault (the request's max_length, a task's max_len); a body
that is not JSON, and a text the route cannot read, are 422s naming the body or the text."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from lmforge.serve.limits import Limits, RequestError, fit_lengths
from lmforge.serve.routes import record_bound

LONG = "word " * 200  # past the encoder's 128 tokens (and under tight's 2 kB bodies)


def _error(answer, status: int, param: str) -> str:
    """The message of an answer that must be `status` naming `param`."""
    assert answer.status_code == status, answer.text
    error = answer.json()["error"]
    assert error["param"] == param, error
    return error["message"]


@pytest.mark.parametrize("path, body", [
    ("/v1/completions", {"prompt": ["the cat"] * 10, "max_tokens": 40, "temperature": 0}),  # 10 x 42 tokens
    ("/v1/completions", {"prompt": ["the cat"] * 10, "max_tokens": 40, "temperature": 0, "stream": True}),
    ("/generate", {"prompt": "the cat", "max_new_tokens": 40, "num_beams": 8}),  # 8 beams x 42 tokens
], ids=["prompts", "prompts-streamed", "beams"])
def test_a_generation_s_tokens_add_up_over_its_prompts_and_beams(tight, path, body):
    with tight.client() as client:
        refused = client.post(path, json={"model": "gen", **body})
        one = client.post(path, json={"model": "gen", **body, "prompt": "the cat", "num_beams": 1})
    message = _error(refused, 413, "max_request_tokens")  # each prompt alone is far under 300
    assert "max_request_tokens=300" in message
    assert one.status_code == 200, one.text  # the same settings for one prompt and one beam are served


def _send(client, method: str, path: str, body: dict):
    return client.get(path, params=body) if method == "GET" else client.post(path, json=body)


def test_a_refusal_advises_truncate_only_where_the_route_takes_it(tight):
    max_tokens = tight.client().get("/info").json()["models"]["enc"]["max_tokens"]
    cases = [("POST", "/fill_mask", {"model": "enc", "text": LONG + "[MASK]"}),
             ("GET", "/attention", {"model": "enc", "text": LONG}),
             ("POST", "/embed", {"model": "enc", "texts": [LONG]})]
    advised = []
    with tight.client() as client:
        for method, path, body in cases:
            message = _error(_send(client, method, path, body), 413, "max_seq_len")
            assert f"max_tokens={max_tokens} in /info" in message  # the words /info uses, its number
            if "truncate" in message:  # the advice, followed, is served
                advised.append(path)
                assert _send(client, method, path, {**body, "truncate": True}).status_code == 200
    assert advised == ["/embed"]


def test_a_features_text_over_the_request_s_max_length_names_max_length(tight):
    max_tokens = tight.client().get("/info").json()["models"]["enc"]["max_tokens"]
    body = {"model": "enc", "texts": "the cat sat on the mat", "layers": "0", "max_length": 3}
    with tight.client() as client:
        refused = client.post("/features", json=body)
        cut = client.post("/features", json={**body, "truncate": True})
    message = _error(refused, 413, "max_length")
    assert "max_length=3" in message and f"max_tokens={max_tokens}" in message
    assert "max_tokens=3" not in message
    assert cut.status_code == 200 and cut.json()["data"][0]["truncated"], cut.text


def test_a_record_over_its_task_s_max_len_says_the_task_s_limit(server):
    info = server.client().get("/info").json()["models"]["cls"]
    max_len = info["task"]["max_len"]
    assert max_len < info["max_tokens"]  # the task reads fewer tokens than the model could
    answer = server.client().post("/predict", json={"model": "cls", "inputs": ["word " * (max_len + 10)]})
    message = _error(answer, 413, "max_seq_len")
    assert f"max_len={max_len}" in message and "max_tokens" not in message


def test_a_qa_context_is_never_cut_so_truncate_cannot_hide_its_tokens():
    limits = Limits(max_request_tokens=100)
    qa, cls = SimpleNamespace(kind="qa", max_len=48), SimpleNamespace(kind="cls", max_len=48)
    assert fit_lengths([500], *record_bound(cls, True, limits), limits) == [48]  # cls reads 48 of them
    with pytest.raises(RequestError) as err:  # QA's windows read all 500
        fit_lengths([500], *record_bound(qa, True, limits), limits)
    assert err.value.status == 413 and err.value.param == "max_request_tokens"
    assert "truncate" not in err.value.message


def test_a_qa_record_costs_the_tokens_its_overlapping_windows_hold():
    from lmforge.serve.records import record_tokens
    from lmforge.tasks.qa import QATask, Template

    # BERT's template: [CLS] q [SEP] c [SEP]; windows of 48 tokens overlapping by 16
    qa = QATask.__new__(QATask)
    qa.kind, qa.max_len, qa.doc_stride, qa.max_query_len = "qa", 48, 16, 24
    qa.template = Template((101,), (102,), (102,), (0, 0, 0, 1, 1))
    counts = [5, 90]  # room 48 - 5 - 3 = 40: windows at 0, 24, 48, 72 read 40 + 40 + 40 + 18 context tokens
    assert record_tokens(qa, counts) == 4 * (5 + 3) + 138 > sum(counts)
    limits = Limits(max_request_tokens=120)  # the texts fit (95); the windows read 170
    with pytest.raises(RequestError) as err:
        fit_lengths([record_tokens(qa, counts)], *record_bound(qa, True, limits), limits)
    assert err.value.status == 413 and "170 tokens" in err.value.message and "windows" in err.value.message
    assert record_tokens(SimpleNamespace(kind="cls"), counts) == 95  # other tasks read each text once


@pytest.mark.parametrize("body", [b'{"model": "enc", "texts": [',
                                  b'{"model": "enc", "texts": "x", "dimensions": ' + b"7" * 5000 + b"}"],
                         ids=["cut-short", "5000-digit-integer"])
def test_a_body_that_is_not_json_is_422_naming_the_body(server, body):
    answer = server.client().post("/embed", content=body, headers={"content-type": "application/json"})
    message = _error(answer, 422, "body")
    assert message.startswith("request body ") and "\n" not in message
    assert "sys." not in message  # Python's advice to its programmer is not the client's


JSON_BODY = b'{"model": "enc", "texts": "x"}'  # a good body, sent under another content-type or none


@pytest.mark.parametrize("body, kind, words", [
    (b'[{"model": "enc", "texts": "x"}]', "application/json", "must be a JSON object, not an array"),
    (b"3", "application/json", "not a number"), (b"null", "application/json", "not null"),
    (b'"x"', "application/json", "not a string"), (b"", "application/json", "has no body"),
    (JSON_BODY, "text/plain", "content-type 'text/plain': send content-type application"),
    (JSON_BODY, None, "sent without a content-type: send content-type application/json"),
], ids=["array", "number", "null", "string", "empty", "text-plain", "no-content-type"])
def test_a_body_that_is_no_json_object_is_422_naming_the_body(server, body, kind, words):
    """Was param null and pydantic's "Input should be a valid dictionary or object to extract fields from"."""
    answer = server.client().post("/embed", content=body, headers={"content-type": kind} if kind else {})
    message = _error(answer, 422, "body")
    assert words in message and "\n" not in message


def test_a_key_given_twice_is_422_naming_it(server):
    """Was a 200 of the last value: the first texts were dropped unsaid."""
    body = b'{"model": "enc", "texts": ["the cat"], "texts": ["a dog"]}'
    answer = server.client().post("/embed", content=body, headers={"content-type": "application/json"})
    assert "given twice" in _error(answer, 422, "texts")


@pytest.mark.parametrize("method, path, query", [
    ("POST", "/fill_mask", {"model": "enc", "text": "the cat sat on the mat"}),
    ("POST", "/fill_mask", {"model": "enc", "text": "the [MASK] sat on the <mask>"}),
    ("POST", "/fill_mask", {"model": "t5", "text": "the cat sat on the mat"}),
    ("GET", "/attention", {"model": "enc", "text": ""}),
    ("GET", "/attention", {"model": "enc", "text": "   "}),
], ids=["no-mask", "two-masks", "t5-no-mask", "empty", "blank"])
def test_a_text_the_route_cannot_read_is_422_naming_text(server, method, path, query):
    with server.client() as client:
        assert "text" in _error(_send(client, method, path, query), 422, "text")


@pytest.mark.parametrize("field, value", [("best_of", 3), ("logprobs", 2), ("logprobs", -1), ("suffix", "."),
                                          ("presence_penalty", 0.5), ("frequency_penalty", -1.0),
                                          ("logit_bias", {"50256": -100})])
def test_an_openai_completion_setting_that_is_not_served_is_refused_never_ignored(server, field, value):
    """OpenAI's extras are ignored where they change nothing (user); one that would change the answer is a
    422 naming it, as n > 1 is: a client never gets one completion where it asked for the best of three."""
    body = {"model": "gen", "prompt": "the cat", "max_tokens": 2, "temperature": 0}
    with server.client() as client:
        refused = client.post("/v1/completions", json={**body, field: value})
        served = client.post("/v1/completions", json={**body, "user": "someone"})
    _error(refused, 422, field)
    assert served.status_code == 200, served.text



@pytest.mark.parametrize("path, body, named", [
    ("/generate", {"top_k": 5}, "top_k"),  # /generate's temperature defaults to 0: greedy
    ("/generate", {"length_penalty": 2.0}, "length_penalty"),  # one beam
    ("/v1/completions", {"temperature": 0, "top_p": 0.5}, "top_p"),
])
def test_a_decoding_setting_the_request_would_not_use_is_422_naming_it(server, path, body, named):
    """As lmforge.generate and the command line refuse it (generate.options.refuse_unused): a setting given
    that greedy or beam search would ignore; its default (OpenAI's clients send top_p=1 always) passes."""
    budget = {"max_new_tokens": 2} if path == "/generate" else {"max_tokens": 2}
    with server.client() as client:
        refused = client.post(path, json={"model": "gen", "prompt": "the cat", **budget, **body})
        default = client.post(path, json={"model": "gen", "prompt": "the cat", **budget, "top_p": 1.0,
                                          "temperature": 0})
    assert "read only" in _error(refused, 422, named)
    assert default.status_code == 200, default.text


@pytest.mark.parametrize("path, body", [
    ("/embed", {"texts": ["the cat"], "dimensions": 8.0}),
    ("/v1/embeddings", {"input": "the cat", "dimensions": 8.0}),
    ("/features", {"texts": ["the cat"], "max_length": 8.0}),
    ("/generate", {"prompt": "the cat", "max_new_tokens": 2.0}),
    ("/v1/completions", {"prompt": "the cat", "max_tokens": 2.0, "temperature": 0}),
])
def test_a_whole_float_is_the_int_it_is_and_a_fraction_is_refused(server, path, body):
    """JSON does not tell 8 from 8.0, and lmforge.embed / .features / .generate and a config file read a whole
    float as its int (config.options.coerce): every route reads it so, and refuses 8.5 naming the field."""
    model = "gen" if path in ("/generate", "/v1/completions") else "enc"
    (field, value), = [(k, v) for k, v in body.items() if isinstance(v, float)]
    with server.client() as client:
        whole = client.post(path, json={"model": model, **body})
        fraction = client.post(path, json={"model": model, **body, field: value + 0.5})
    assert whole.status_code == 200, whole.text
    assert "whole number" in _error(fraction, 422, field)


def test_a_features_max_length_past_the_model_s_positions_is_422_as_offline(server):
    """lmforge.features and `lmforge features` refuse a max_length the model cannot read (within_context);
    the server did not: it cut at its own limit and answered 200."""
    body = {"model": "enc", "texts": ["the cat " * 400], "truncate": True}
    with server.client() as client:
        refused = client.post("/features", json={**body, "max_length": 100_000})
        served = client.post("/features", json=body)
    assert "more tokens than the model reads" in _error(refused, 422, "max_length")
    (text,) = served.json()["data"]
    assert served.status_code == 200 and text["truncated"]  # within the model: cut to it, as asked



@pytest.mark.parametrize("truncate", [False, True])
def test_a_features_max_length_with_no_room_beside_the_special_tokens_is_422_either_way(server, truncate):
    """The library refuses max_length=2 for BERT ([CLS] and [SEP] fill it) whatever truncate says
    (config.checks.room_for_text); the server answered 413 without truncate and 422 with it."""
    with server.client() as client:
        answer = client.post("/features", json={"model": "enc", "texts": ["the cat sat"], "max_length": 2,
                                                "truncate": truncate})
    assert "leaves no room next to the model's 2 special tokens" in _error(answer, 422, "max_length")


@pytest.mark.parametrize("path, field, model", [
    ("/embed", "texts", "enc"), ("/v1/embeddings", "input", "enc"), ("/features", "texts", "enc"),
    ("/predict", "inputs", "cls"), ("/v1/completions", "prompt", "gen")])
def test_an_empty_list_is_refused_as_the_spec_says(server, path, field, model):
    with server.client() as client:
        spec = client.get("/openapi.json").json()
        refused = client.post(path, json={"model": model, field: []})
    schema = spec["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    assert spec["components"]["schemas"][schema.split("/")[-1]]["properties"][field]["minItems"] == 1
    assert "is empty" in _error(refused, 422, field)


def test_fill_mask_refuses_a_long_text_from_its_head_without_tokenizing_it_whole(model_dirs):
    """/fill_mask tokenized its text whole for the 413 (a 4 MB body: 4.6 s of the server's tokenizer); as
    /embed's and /features' texts, its first max_tokens x 128 characters already hold too many tokens."""
    from fastapi.testclient import TestClient

    from lmforge.serve.app import create_app
    from lmforge.serve.limits import MAX_TOKEN_CHARS
    from lmforge.serve.models import load_served

    served = load_served("enc", model_dirs["enc"])
    counted, count = [], served.count
    served.count = lambda texts, pairs=None: counted.extend(map(len, texts)) or count(texts, pairs)
    text = "the [MASK] sat " + "word " * 20_000
    with TestClient(create_app({"enc": served}, threads=1)) as client:
        message = _error(client.post("/fill_mask", json={"text": text}), 413, "max_seq_len")
    assert message.startswith("text is more than") and "truncate" not in message  # fill-mask cuts nothing
    assert counted and max(counted) <= served.max_tokens * MAX_TOKEN_CHARS < len(text)


def test_fill_mask_takes_a_long_text_of_few_tokens_whose_head_would_end_mid_word(model_dirs):
    """A head cut inside a word made more tokens than the text: WordPiece reads a 150-character word as one
    [UNK], its first 60 characters as 60 pieces. 110 such words (115 tokens, within max_tokens=128) were
    refused for the 174 tokens of their first 16,384 characters; the head now ends at a whole word."""
    from fastapi.testclient import TestClient

    from lmforge.serve.app import create_app
    from lmforge.serve.limits import MAX_TOKEN_CHARS
    from lmforge.serve.models import load_served

    served = load_served("enc", model_dirs["enc"])
    text = "the [MASK] sat " + ("a" * 150 + " ") * 110
    room = served.max_tokens * MAX_TOKEN_CHARS
    assert len(text) > room and len(served.front.encode(text).ids) <= served.max_tokens
    assert len(served.front.encode(text[:room]).ids) > served.max_tokens  # the cut word's pieces
    with TestClient(create_app({"enc": served}, threads=1)) as client:
        answer = client.post("/fill_mask", json={"text": text, "top_k": 2})
    assert answer.status_code == 200, answer.text
    assert len(answer.json()["candidates"]) == 2
