"""The checks a request meets before any route parses it (body.py), and the bounded parsing of what
a client sizes: attention layers and generation costs, each refused before anything is built."""
from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest

import lmforge

from lmforge.serve.body import Pending, Share, checked_body, given_twice, not_unicode, read_body, too_deep
from lmforge.serve.limits import Limits, RequestError, bounded_ids, check_generation
from lmforge.serve.routes import parse_layers


@pytest.mark.parametrize("body, depth", [
    (b"1", 0), (b"[]", 1), (b'{"a": [1, {"b": [2]}]}', 4), (b'["[[[[", "\\"[[["]', 1),
    (b'{"a": "\\\\"}', 1), (b"[" * 40 + b"]" * 40, 40),
])
def test_too_deep_measures_the_nesting_strings_skipped(body, depth):
    assert too_deep(body, depth - 1) if depth else True
    assert not too_deep(body, depth)


def test_too_deep_is_one_pass_over_a_bomb():
    start = time.perf_counter()
    assert too_deep(b"[" * 3_000_000, 32)
    assert not too_deep(b'"' + b'\\"' * 1_000_000 + b"\\" + b"[" * 40, 32)  # all one unterminated string
    assert time.perf_counter() - start < 5


@pytest.mark.parametrize("body, field", [
    (b'{"texts": ["ok", "a\\ud800"]}', "texts.1"),
    (b'{"inputs": [{"text": "ok"}, {"text": "x\xc3"}]}', "inputs.1.text"),
    (b'{"text": "\xff"}', "text"),
    (b'"\\udc00"', "body"),
    (b'{"t": "\\ud83d\\ude00 fine", "u": "caf\xc3\xa9"}', None),  # a pair and real UTF-8 are Unicode
    (b'{"t": "\\\\ud800 is text"}', None),  # an escaped backslash: the letters, not a surrogate
])
def test_not_unicode_names_the_field(body, field):
    assert not_unicode(body) == field


@pytest.mark.parametrize("body, field", [
    (b'{"texts": ["a"], "texts": ["b"]}', "texts"),
    (b'{"query": "q", "documents": ["a", {"text": "b", "text": "c"}]}', "documents.1.text"),
    (b'{"a": {"b": 1}, "b": 2}', None), (b'[{"a": 1}, {"a": 2}]', None), (b'{"a": ', None),
])
def test_given_twice_names_the_key_an_object_repeats(body, field):
    assert given_twice(body) == field


def test_layers_are_bounded_before_any_range_is_made():
    limits = Limits(max_layers=4)
    twelve, four = (lmforge.build(lmforge.tiny("bert-base", n_layers=n)) for n in (12, 4))
    assert parse_layers("0,2-3", twelve, limits) == [0, 2, 3] and parse_layers(None, four, limits) is None
    start = time.perf_counter()
    for spec in ("0-10000000", "0-" + "9" * 5000, "3-1", "-1", "a"):
        with pytest.raises(RequestError) as err:
            parse_layers(spec, twelve, limits)
        assert (err.value.status, err.value.param) == (422, "layers")
    assert time.perf_counter() - start < 1
    for spec, model in (("0-7", twelve), (",".join(["1"] * 100_000), twelve), (None, twelve)):
        with pytest.raises(RequestError) as err:
            parse_layers(spec, model, limits)
        assert (err.value.status, err.value.param) == (413, "max_layers")


@pytest.mark.parametrize("field, value, limit", [
    ("num_beams", 17, "max_num_beams"), ("num_return_sequences", 17, "max_return_sequences"),
    ("top_k", 1001, "max_sampling_top_k"),
])
def test_generation_costs_are_413_naming_the_limit(field, value, limit):
    body = SimpleNamespace(**{"num_beams": 1, "top_k": 0, field: value})
    check_generation(SimpleNamespace(num_beams=16, top_k=1000, num_return_sequences=16), 10, Limits())
    with pytest.raises(RequestError) as err:
        check_generation(body, 10, Limits())
    assert (err.value.status, err.value.param) == (413, limit) and field in err.value.message
    with pytest.raises(RequestError, match="max_tokens=2000"):
        check_generation(SimpleNamespace(), 2000, Limits(max_new_tokens=1000), "max_tokens")


def test_a_long_text_is_refused_from_its_head():
    seen = []

    def encode(text: str) -> list:
        seen.append(len(text))
        return text.split()

    limits = Limits(max_input_tokens=100)
    with pytest.raises(RequestError, match="first 799 characters") as err:  # its head: whole words
        bounded_ids("text", encode, "word " * 2000, limits)
    assert err.value.param == "max_input_tokens" and seen == [799]  # the rest never tokenized
    assert len(bounded_ids("text", encode, "w" * 5000, limits)) == 1


def test_a_long_text_of_few_wordpiece_tokens_is_taken_though_its_head_would_end_mid_word():
    """WordPiece reads a 150-character word as one [UNK], its first 98 characters as 98 pieces: the head
    (the first 400 characters for max_input_tokens=50) cut the third word there and held 102 tokens, so a
    text of 22 tokens was refused; the head now ends at a whole word (limits.text_head)."""
    from tests.serve.conftest import _tokenizer

    tokenizer = _tokenizer("bert")  # the served encoder's: WordPiece
    text, limits = ("a" * 150 + " ") * 20, Limits(max_input_tokens=50)
    assert len(tokenizer.encode(text[:400]).ids) > 50 + 1  # the old head, less its one token of slack
    ids = bounded_ids("text", lambda t: tokenizer.encode(t).ids, text, limits)
    assert ids == tokenizer.encode(text).ids and len(ids) <= limits.max_input_tokens


def test_strict_numbers_bounded_seeds_and_unknown_query_parameters_are_refused():
    """Probes of the second round: a bool is not a count, a seed has an upper bound, and a misspelt
    query parameter of /attention is refused, as a body's unknown field is."""
    import pydantic

    from lmforge.serve import generation_schemas, option_schemas

    # a bool is no count; max_span's bound is FillOptions', judged by the route as lmforge.fill_mask judges it
    with pytest.raises(pydantic.ValidationError):
        option_schemas.FillMaskRequest(text="a [MASK]", top_k=True)
    with pytest.raises(pydantic.ValidationError):
        generation_schemas.DecodingBase(seed=10**23)
    assert generation_schemas.DecodingBase(seed=2**63 - 1).seed == 2**63 - 1


def _read(share: Share, chunks: list, declared: int | None = None) -> list:
    """read_body over `chunks` (a client's body as it arrives), its bytes held in `share`."""
    messages = [{"type": "http.request", "body": chunk, "more_body": i < len(chunks) - 1}
                for i, chunk in enumerate(chunks)]

    async def receive():
        return messages.pop(0)

    headers = {} if declared is None else {b"content-length": str(declared).encode()}
    return asyncio.run(read_body(receive, headers, 1000, share))


def test_the_bodies_held_at_once_are_bounded_and_given_back():
    """Each slow client held its body's bytes without bound (150 held 350 MB): now 429 past
    max_pending_bytes, the declared bytes held before any arrives, a chunked body's as it comes."""
    pending = Pending(100)
    first = Share(pending)
    _read(first, [b"x" * 60], declared=60)
    with pytest.raises(RequestError) as err:  # declared: refused before a byte is read
        _read(Share(pending), [b"x" * 50], declared=50)
    assert err.value.status == 429 and err.value.param == "max_pending_bytes"
    assert err.value.headers["Retry-After"] == "1"
    late = Share(pending)
    with pytest.raises(RequestError):  # chunked: at the chunk that passes the bound
        _read(late, [b"x" * 30, b"x" * 30])
    assert late.bytes == 30 and pending.held == 90
    late.release()
    first.release()
    assert pending.held == 0
    alone = Share(pending)
    _read(alone, [b"x" * 500])  # alone, a body over the bound passes: one body always may (max_body_bytes)
    assert alone.bytes == pending.held == 500


@pytest.mark.parametrize("coding", [b"gzip", b"GZIP", b"br", b"deflate", b"identity, gzip", b"x-unknown"])
def test_a_coded_body_is_415_naming_content_encoding_before_it_is_read(coding):
    """A gzip body was read as JSON: 422 "not valid JSON: 'utf-8' codec can't decode", naming body."""
    async def receive():
        raise AssertionError("the body was read")

    headers = {b"content-encoding": coding, b"content-length": b"10"}
    with pytest.raises(RequestError) as err:
        asyncio.run(checked_body(receive, headers, Limits()))
    assert err.value.status == 415 and err.value.param == "content-encoding"
    assert "bodies are read uncompressed" in err.value.message
    assert err.value.headers == {"Accept-Encoding": "identity"}


def test_a_header_sent_twice_is_read_whole_so_a_second_identity_hides_no_gzip():
    """The guard read dict(scope headers), which kept the last of a repeated name."""
    from lmforge.serve.body import header_map

    async def receive():
        raise AssertionError("the body was read")

    pairs = [(b"content-encoding", b"gzip"), (b"content-type", b"application/json"),
             (b"content-encoding", b"identity")]
    assert header_map(pairs)[b"content-encoding"] == b"gzip, identity"
    with pytest.raises(RequestError) as err:
        asyncio.run(checked_body(receive, header_map(pairs), Limits()))
    assert err.value.status == 415 and err.value.param == "content-encoding"


@pytest.mark.parametrize("headers", [{}, {b"content-encoding": b"identity"},
                                     {b"content-encoding": b" Identity "}])
def test_an_uncoded_body_is_read(headers):
    messages = [{"type": "http.request", "body": b'{"a": 1}', "more_body": False}]

    async def receive():
        return messages.pop(0)

    async def replayed():
        return await (await checked_body(receive, headers, Limits()))()

    assert asyncio.run(replayed())["body"] == b'{"a": 1}'


def test_the_server_answers_a_gzip_body_415(local):
    import gzip
    import json

    body = gzip.compress(json.dumps({"texts": ["the cat"]}).encode())
    answer = local.post("/embed", content=body, headers={"content-type": "application/json",
                                                           "content-encoding": "gzip"})
    assert answer.status_code == 415, answer.text
    assert answer.json()["error"]["param"] == "content-encoding"
    assert answer.headers["accept-encoding"] == "identity"
