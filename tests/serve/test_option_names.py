"""The OpenAI-style routes never ignore lmforge's own settings: /v1/embeddings reads every EmbedOptions
field and judges it as /embed does; /v1/completions refuses lmforge's names of the settings it takes under
OpenAI's (or not at all), naming the field and the route's name, while OpenAI clients' extras pass. A null
option field is not given (its default) on the routes whose options objects read None so; a generation
setting's null is refused in the API's words, as lmforge.generate refuses None."""
from __future__ import annotations

import dataclasses
import math

import pytest

from lmforge.analysis.feature_options import FeatureOptions
from lmforge.generate.options import GenerationOptions
from lmforge.heads import attach
from lmforge.pipelines.embed_options import EmbedOptions
from lmforge.pipelines.rerank import RerankQueryOptions
from tests.serve.conftest import _save, _task, _tiny, _tokenizer

fastapi = pytest.importorskip("fastapi")
from fastapi.testclient import TestClient

from lmforge.serve import generation_schemas, option_schemas
from lmforge.serve.app import create_app
from lmforge.serve.models import load_served

TEXT = "the cat sat on the mat"
PROMPT = {"model": "gpt", "prompt": "the cat", "max_tokens": 2, "temperature": 0}


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    """A client of the server's app on an encoder (bert), a decoder (gpt) and a reranker (rr)."""
    root = tmp_path_factory.mktemp("option-names")
    bert, gpt = _tokenizer("bert"), _tokenizer("gpt2")
    decoder = _tiny("gpt2", gpt, 4, max_seq_len=64)
    attach(decoder, "lm")
    dirs = {"bert": _save(_tiny("bert-base", bert, 3, max_seq_len=32), bert, root / "bert"),
            "gpt": _save(decoder, gpt, root / "gpt"),
            "rr": _task("rerank", None, bert, root / "rr", 5)}
    with TestClient(create_app({n: load_served(n, d) for n, d in dirs.items()}, threads=1)) as client:
        yield client


def _verdict(answer) -> tuple:
    """(status, the refused field or None)."""
    return answer.status_code, answer.json()["error"]["param"] if answer.status_code != 200 else None


@pytest.mark.parametrize("options", [
    {"normalize": False}, {"dimensions": 8, "normalize": False}, {"prompt": "query: "},
    {"prompt": "x" * 4097},
    {"prompt_name": "q"}, {"max_chunks": 0}, {"max_chunks": 2}, {"truncate": "chunk", "max_chunks": 2},
    {"batch_invariant": 1}, {"batch_invariant": True}, {"encoding_format": "ubinary"}, {"truncate": "cut"},
], ids=lambda options: ",".join(options))
def test_v1_embeddings_reads_every_embed_option_as_embed_does(client, options):
    """The same request to both routes: the same refusal naming the same field, or the same vectors."""
    openai = client.post("/v1/embeddings", json={"model": "bert", "input": [TEXT], **options})
    own = client.post("/embed", json={"model": "bert", "texts": [TEXT], **options})
    assert _verdict(openai) == _verdict(own), (openai.text[:300], own.text[:300])
    if own.status_code == 200:
        assert openai.json()["data"][0]["embedding"] == pytest.approx(own.json()["embeddings"][0], abs=1e-6)


def test_v1_embeddings_normalize_false_is_served_not_ignored(client):
    body = {"model": "bert", "input": TEXT}
    raw = client.post("/v1/embeddings", json={**body, "normalize": False}).json()["data"][0]["embedding"]
    unit = client.post("/v1/embeddings", json=body).json()["data"][0]["embedding"]
    assert math.hypot(*unit) == pytest.approx(1.0) and math.hypot(*raw) != pytest.approx(1.0)
    spec = client.get("/openapi.json").json()["components"]["schemas"]
    fields = set(spec["EmbeddingsRequest"]["properties"])
    assert {f.name for f in dataclasses.fields(EmbedOptions)} <= fields  # what docs/serve.md promises


def _lmforge_names(client) -> list:
    """lmforge's settings (GenerationOptions' fields, /generate's) that /v1/completions' spec lacks."""
    spec = client.get("/openapi.json").json()["components"]["schemas"]
    generate, completions = (set(spec[f"{name}Request"]["properties"]) for name in ("Generate", "Completion"))
    return sorted(({f.name for f in dataclasses.fields(GenerationOptions)} | generate) - completions)


def test_v1_completions_refuses_lmforge_s_names_and_says_its_own(client):
    names = _lmforge_names(client)
    assert {"max_new_tokens", "do_sample", "num_return_sequences"} <= set(names)
    for name in names:
        answer = client.post("/v1/completions", json={**PROMPT, name: 2})
        assert _verdict(answer) == (422, name), answer.text
        message = answer.json()["error"]["message"]
        assert message.startswith(f"{name}: ") and "/v1/completions" in message
    said = client.post("/v1/completions", json={**PROMPT, "max_new_tokens": 2}).json()["error"]["message"]
    assert said == "max_new_tokens: /v1/completions takes max_tokens"
    taken = client.get("/openapi.json").json()["components"]["schemas"]["CompletionRequest"]["properties"]
    # each rename is of a refused name, to a field taken
    for name, route_s in generation_schemas.RENAMED["/v1/completions"].items():
        assert name in names and route_s.split()[0] in taken


def test_generate_refuses_lmforge_s_settings_it_does_not_take_saying_why(client):
    """/generate refuses unknown fields; lmforge's own settings it lacks were refused in pydantic's bare
    "Extra inputs are not permitted": now, as on /v1/completions, naming the field and saying why."""
    taken = client.get("/openapi.json").json()["components"]["schemas"]["GenerateRequest"]["properties"]
    names = sorted({f.name for f in dataclasses.fields(GenerationOptions)} - set(taken))
    assert {"do_sample", "eos_token_id", "num_return_sequences", "pad_token_id"} <= set(names)
    for name in names:
        answer = client.post("/generate", json={"model": "gpt", "prompt": "the cat", "max_new_tokens": 2,
                                                name: 2})
        assert _verdict(answer) == (422, name), answer.text
        message = answer.json()["error"]["message"]
        assert message.startswith(f"{name}: ") and "/generate" in message and "Extra inputs" not in message
    said = client.post("/generate", json={"model": "gpt", "prompt": "a", "do_sample": True}).json()
    assert said["error"]["message"] == "do_sample: /generate takes temperature (0: greedy, > 0: samples)"
    typo = client.post("/generate", json={"model": "gpt", "prompt": "a", "max_new_tokenz": 2}).json()
    assert typo["error"]["param"] == "max_new_tokenz"  # a name that is no setting: still refused


def test_v1_completions_still_ignores_openai_clients_extras(client):
    answer = client.post("/v1/completions", json={**PROMPT, "user": "someone", "metadata": {"a": 1},
                                                  "stream_options": None, "service_tier": "auto"})
    assert answer.status_code == 200, answer.text
    assert answer.json()["usage"]["completion_tokens"] <= 2


@pytest.mark.parametrize("field, value, words", [
    ("texts", ["a dog"], "/v1/embeddings takes input"), ("pooling", "max", "a setting of /features"),
    ("layers", None, "a setting of /features"),
])
def test_v1_embeddings_refuses_lmforge_s_names_it_does_not_take(client, field, value, words):
    """/embed's texts and /features' settings were ignored unsaid, as an OpenAI client's extras are."""
    answer = client.post("/v1/embeddings", json={"model": "bert", "input": [TEXT], field: value})
    assert _verdict(answer) == (422, field), answer.text
    assert words in answer.json()["error"]["message"]


OPTION_ROUTES = [("/embed", {"model": "bert", "texts": [TEXT]}, EmbedOptions),
                 ("/v1/embeddings", {"model": "bert", "input": [TEXT]}, EmbedOptions),
                 ("/features", {"model": "bert", "texts": [TEXT], "layers": -1}, FeatureOptions),
                 ("/rerank", {"model": "rr", "query": TEXT, "documents": ["a dog", TEXT]},
                  RerankQueryOptions)]


@pytest.mark.parametrize("path, body, field", [(path, body, f.name) for path, body, cls in OPTION_ROUTES
                                               for f in dataclasses.fields(cls)],
                         ids=lambda v: v if isinstance(v, str) else "")
def test_a_null_option_is_its_default_as_python_reads_none(client, path, body, field):
    """{field: null} answers as the field left out, as the options object's build() reads None."""
    left_out = client.post(path, json={k: v for k, v in body.items() if k != field})
    null = client.post(path, json={**body, field: None})
    assert null.status_code == left_out.status_code == 200, (null.text[:300], left_out.text[:300])
    assert null.json() == left_out.json()


@pytest.mark.parametrize("field", generation_schemas.DECODING)
def test_a_null_generation_setting_is_refused_in_the_api_s_words(client, field):
    """lmforge.generate refuses None, so /generate refuses null: naming the field, in JSON's words."""
    body = {"model": "gpt", "prompt": "the cat", "max_new_tokens": 2, field: None}
    answer = client.post("/generate", json=body)
    assert _verdict(answer) == (422, field), answer.text
    message = answer.json()["error"]["message"]
    python = ("Union", "Optional", "None", "Value error")  # a type's name or pydantic's words
    assert "null" in message and not any(word in message for word in python)
    if field == "early_stopping":
        assert message == 'early_stopping: must be true, false or "never", got null'


@pytest.mark.parametrize("path, body, field, whole", [
    ("/v1/completions", PROMPT, "n", 1.0), ("/v1/completions", PROMPT, "best_of", 1.0),
    ("/v1/completions", {**PROMPT, "temperature": 1}, "seed", 5.0),
    ("/generate", {"model": "gpt", "prompt": "the cat", "max_new_tokens": 2, "temperature": 1}, "seed", 5.0),
], ids=lambda v: v if isinstance(v, str) and not v.startswith("/") else None)
def test_an_int_field_reads_a_whole_float_as_every_options_field_does(client, path, body, field, whole):
    """seed, n and best_of refused 1.0 ('Input should be a valid integer') where the same route's
    options fields (max_tokens, top_n, dimensions) read it as 1, and JSON Schema's integer takes it."""
    def answer(value) -> dict:  # without a completion's id and time
        return {k: v for k, v in client.post(path, json={**body, field: value}).json().items()
                if k not in ("id", "created")}
    assert "error" not in answer(whole) and answer(whole) == answer(int(whole))
    for bad in (whole + 0.5, True, str(int(whole))):  # a fraction, a bool, a string: still refused
        assert _verdict(client.post(path, json={**body, field: bad})) == (422, field)


def test_fill_mask_s_counts_read_a_whole_float_too():
    """FillMaskRequest's top_k and max_span read 3.0 as 3 too (they refused it, as seed and n did)."""
    import pydantic

    read = option_schemas.FillMaskRequest(text="a [MASK]", top_k=3.0, max_span=4.0)
    assert (read.top_k, read.max_span) == (3, 4) and type(read.top_k) is int
    for bad in ({"top_k": 3.5}, {"top_k": True}, {"max_span": "4"}):
        with pytest.raises(pydantic.ValidationError):
            option_schemas.FillMaskRequest(text="a [MASK]", **bad)


def test_features_layers_reads_a_whole_float_as_lmforge_features_does():
    """FeaturesRequest refused layers=2.0 ('Input should be a valid integer') where FeatureOptions, and so
    lmforge.features, reads it as layer 2: a union admitting an int and no float reads a whole float as
    its int on every face (config.options.whole_kind)."""
    import pydantic

    from lmforge.serve.option_schemas import FeaturesRequest

    assert FeatureOptions(layers=2.0).layers == 2
    read = FeaturesRequest(texts="a", layers=2.0)
    assert read.layers == 2 and type(read.layers) is int
    for bad in (2.5, True):  # a fraction and a bool: refused by both
        with pytest.raises(pydantic.ValidationError):
            FeaturesRequest(texts="a", layers=bad)
