"""/fill_mask's request is made from FillOptions, lmforge.fill_mask's and `lmforge fill-mask`'s options
object: its fields' help, defaults and bounds are the object's in the spec, a value the object refuses is a
422 naming the field in the library's words, and the server's own max_top_k, which may allow fewer, is a
413 naming it, checked first, as /generate checks max_new_tokens against its limit."""
from __future__ import annotations

import dataclasses

import pytest
from fastapi.testclient import TestClient

from lmforge.config.options import OptionsError
from lmforge.heads import attach
from lmforge.pipelines.fill_mask import MAX_SPAN, MAX_TOP_K, FillOptions, check_fill
from lmforge.serve.app import create_app
from lmforge.serve.limits import Limits
from lmforge.serve.models import load_served
from lmforge.serve.option_schemas import FillMaskRequest
from tests.serve.conftest import _save, _tiny, _tokenizer

TEXT = "the [MASK] sat on the mat"


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    """A client of the server's app on a BERT with its masked-LM head, max_top_k 100 (the default)."""
    bert = _tokenizer("bert")
    model = _tiny("bert-base", bert, 3, max_seq_len=32)
    attach(model, "lm")
    where = _save(model, bert, tmp_path_factory.mktemp("fill-mask-options") / "bert")
    with TestClient(create_app({"bert": load_served("bert", where)}, threads=1)) as client:
        yield client


def test_the_request_s_fields_are_fill_options_with_their_help_defaults_and_bounds():
    spec = FillMaskRequest.model_json_schema()["properties"]
    for f in dataclasses.fields(FillOptions):
        field = spec[f.name]
        assert (field["default"], field["minimum"], field["maximum"]) == \
            (f.default, f.metadata["low"], f.metadata["high"])
        assert field["description"].startswith(f.metadata["help"])
    assert (spec["top_k"]["maximum"], spec["max_span"]["maximum"]) == (MAX_TOP_K, MAX_SPAN)
    assert "max_top_k" in spec["top_k"]["description"]  # the server's own limit, said beside the object's


@pytest.mark.parametrize("field, value", [("top_k", 0), ("top_k", -3), ("max_span", 0),
                                          ("max_span", MAX_SPAN + 1), ("max_span", 10**6)])
def test_a_value_fill_options_refuses_is_a_422_in_lmforge_fill_mask_s_words(client, field, value):
    with pytest.raises(OptionsError) as refused:
        check_fill(**{"top_k": 5, "max_span": 10, field: value})
    answer = client.post("/fill_mask", json={"model": "bert", "text": TEXT, field: value})
    assert answer.status_code == 422, answer.text
    assert answer.json()["error"] == {"message": str(refused.value), "type": "invalid_request_error",
                                      "param": field, "code": 422}


@pytest.mark.parametrize("top_k", [Limits().max_top_k + 1, MAX_TOP_K, MAX_TOP_K + 1, 10**9])
def test_top_k_past_the_server_s_limit_is_a_413_naming_it_before_the_object_judges(client, top_k):
    answer = client.post("/fill_mask", json={"model": "bert", "text": TEXT, "top_k": top_k})
    assert answer.status_code == 413 and answer.json()["error"]["param"] == "max_top_k", answer.text


@pytest.mark.parametrize("field", ["top_k", "max_span"])
def test_a_null_is_refused_as_lmforge_fill_mask_refuses_none(client, field):
    with pytest.raises(OptionsError):
        check_fill(**{"top_k": 5, "max_span": 10, field: None})
    answer = client.post("/fill_mask", json={"model": "bert", "text": TEXT, field: None})
    assert answer.status_code == 422 and answer.json()["error"]["param"] == field, answer.text


def test_whole_floats_within_the_bounds_are_served_as_their_ints(client):
    answer = client.post("/fill_mask", json={"model": "bert", "text": TEXT, "top_k": 3.0, "max_span": 4.0})
    assert answer.status_code == 200 and len(answer.json()["candidates"]) == 3, answer.text
