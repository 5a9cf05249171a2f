"""Every answer of a real server equals the library's single-request output, whatever its neighbours
in a batch: embeddings, task predictions, fill-mask, generation (whole, streamed, beams, sampling; the
`lmforge generate` command's text), attention views; the OpenAI details, the spec, /info and /metrics."""
from __future__ import annotations

import asyncio
import base64
import json
import random
import re

import httpx
import numpy as np
import pytest
import torch

import lmforge
from lmforge.analysis.attention import attention_maps
from lmforge.analysis.view import write_html
from lmforge.cli import main
from lmforge.generate.text import continuation
from lmforge.pipelines.embed import SentenceEncoder
from lmforge.tasks.finetune import TaskConfig, evaluate, load_model, make_task, task_info
from tests.serve.test_units import parse_prometheus

WORDS = "the small cat dog bird sat on a mat near river hill road today quick old red".split()


def texts_of_mixed_length(n: int, seed: int = 0, longest: int = 60) -> list:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, longest))) for _ in range(n)]


async def _post_all(url: str, calls: list) -> list:
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        return await asyncio.gather(*(client.post(path, json=body) for path, body in calls))


def metric(url: str, family: str, sample: str | None = None, **labels) -> float:
    """The sum of one family's samples (named `sample`, with these labels) on the server's /metrics."""
    families = parse_prometheus(httpx.get(url + "/metrics").text)
    return sum(v for name, found, v in families[family]
               if (sample is None or name == sample) and all(found.get(k) == w for k, w in labels.items()))


def test_concurrent_embeddings_equal_single_text_offline_output(server, model_dirs):
    texts = texts_of_mixed_length(48)
    calls, expected = [], []
    for i in range(0, 40, 2):  # 1- and 2-text requests, both routes
        batch = texts[i:i + 1 + i % 4 // 2]
        calls.append(("/embed", {"model": "enc", "texts": batch}) if i % 8 else
                     ("/v1/embeddings", {"model": "enc", "input": batch}))
        expected.append(batch)
    calls.append(("/embed", {"model": "enc", "texts": texts}))  # 48 texts > 16 a batch: split server-side
    expected.append(texts)
    batches_before = metric(server.url, "lmforge_batch_size", "lmforge_batch_size_count", kind="embed")
    answers = asyncio.run(_post_all(server.url, calls))
    encoder = SentenceEncoder.from_dir(model_dirs["enc"])
    offline = {t: encoder.encode([t])[0] for t in texts}  # each text alone: no neighbours
    for (path, _), batch, answer in zip(calls, expected, answers):
        assert answer.status_code == 200, answer.text
        body = answer.json()
        vectors = body["embeddings"] if path == "/embed" else [d["embedding"] for d in body["data"]]
        assert len(vectors) == len(batch)
        for text, vector in zip(batch, vectors):
            assert (torch.tensor(vector) - offline[text]).abs().max() <= 1e-5
    batches = metric(server.url, "lmforge_batch_size", "lmforge_batch_size_count", kind="embed")
    batches -= batches_before
    assert batches < len(calls) + 2  # neighbours shared forward passes (48 texts alone need 3)


def _offline_task(path):
    info = task_info(path)
    model, tokenizer = load_model(str(path))
    options = {k: info[k] for k in ("label_all", "doc_stride", "max_query_len", "n_best", "max_answer_len",
                                    "unanswerable", "null_threshold") if k in info}
    return make_task(info["kind"], model, tokenizer, [], TaskConfig(max_len=info["max_len"], **options),
                     info.get("labels")).eval()


def test_concurrent_predictions_equal_the_library_on_one_record(server, model_dirs, tmp_path):
    texts = texts_of_mixed_length(12, seed=1, longest=40)
    cases = {"cls": [{"text": t} for t in texts],
             "tag": [{"words": t.split()} for t in texts],
             "qa": [{"question": "where is the cat", "context": t} for t in texts_of_mixed_length(6, 2, 70)]}
    calls = [("/predict", {"model": name, "inputs": [r]}) for name, records in cases.items() for r in records]
    answers = iter(asyncio.run(_post_all(server.url, calls)))
    for name, records in cases.items():
        task = _offline_task(model_dirs[name])
        # the library's own predictions, one example a batch: each record as predicted alone, one model load
        evaluate(model_dirs[name], records, out=tmp_path / "p.jsonl", batch_size=1)
        lines = (tmp_path / "p.jsonl").read_text().splitlines()
        predicted = [json.loads(line)["prediction"] for line in lines]
        assert len(predicted) == len(records)
        for record, expected in zip(records, predicted):
            answer = next(answers)
            assert answer.status_code == 200, answer.text
            (got,) = answer.json()["predictions"]
            if name == "cls":
                examples = task.encode_all([record])
                probs = task.outputs(examples)[0]
                assert got["label"] == expected
                assert max(abs(got["scores"][label] - p) for label, p in zip(task.labels, probs)) <= 1e-5
            elif name == "tag":
                assert [t["tag"] for t in got["tags"]] == expected
            else:
                assert got["answer"] == expected
                assert record["context"][got["start"]:got["end"]] == expected


def test_a_tagged_word_past_the_cut_is_null_on_the_server_and_in_evaluate(server, model_dirs, tmp_path):
    """Under truncate the words past max_len were not read: their tag is null, not a predicted "O"."""
    words = ("the cat sat on the mat " * 20).split()  # 120 words, past the task's max_len of 64
    with server.client() as client:
        answer = client.post("/predict", json={"model": "tag", "inputs": [{"words": words}],
                                               "truncate": True})
    assert answer.status_code == 200, answer.text
    tags = [t["tag"] for t in answer.json()["predictions"][0]["tags"]]
    read = next(i for i, t in enumerate(tags) if t is None)
    assert 0 < read < len(words) and all(t is None for t in tags[read:])
    evaluate(model_dirs["tag"], [{"words": words}], out=tmp_path / "p.jsonl")
    assert json.loads((tmp_path / "p.jsonl").read_text())["prediction"] == tags


@pytest.mark.parametrize("name, text", [("enc", "the cat [MASK] on the mat"),
                                        ("t5", "the cat <mask> on the mat")])
def test_fill_mask_equals_the_library(server, model_dirs, name, text):
    answer = httpx.post(server.url + "/fill_mask", json={"model": name, "text": text, "top_k": 3}, timeout=60)
    assert answer.status_code == 200, answer.text
    model, tokenizer = lmforge.load(model_dirs[name]), lmforge.load_tokenizer(model_dirs[name])
    expected = lmforge.fill_mask(model, tokenizer, text, top_k=3)
    got = answer.json()["candidates"]
    assert [c["token"] for c in got] == [c.token for c in expected]
    assert max(abs(c["score"] - e.score) for c, e in zip(got, expected)) <= 1e-5


def _events(response) -> list:
    lines = [line[len("data: "):] for line in response.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


@pytest.fixture(scope="module")
def decoder(model_dirs):
    return lmforge.load(model_dirs["gen"]), lmforge.load_tokenizer(model_dirs["gen"])


def _offline(decoder, prompt: str, **options) -> list:
    model, tokenizer = decoder
    ids = torch.tensor([tokenizer.encode(prompt, add_special_tokens=False).ids])
    eos = tokenizer.eos_id if model.config.eos_token_id is None else model.config.eos_token_id
    return lmforge.generate(model, ids, eos_token_id=eos, **options)[0, ids.shape[1]:].tolist()


def test_streamed_and_whole_generation_equal_library_greedy(server, decoder):
    prompt, n = "the quick dog sat", 30
    expected = _offline(decoder, prompt, max_new_tokens=n)
    with server.client() as client:
        whole = client.post("/generate", json={"model": "gen", "prompt": prompt, "max_new_tokens": n}).json()
        with client.stream("POST", "/generate", json={"model": "gen", "prompt": prompt, "max_new_tokens": n,
                                                      "stream": True}) as response:
            events = _events(response)
        with client.stream("POST", "/v1/completions", json={"model": "gen", "prompt": prompt, "max_tokens": n,
                                                            "temperature": 0, "stream": True}) as response:
            chunks = _events(response)
    assert whole["token_ids"] == expected
    assert [t for e in events[:-1] for t in e["token_ids"]] == expected == events[-1]["token_ids"]
    assert "".join(e["text"] for e in events[:-1]) == events[-1]["text"] == whole["text"]
    assert [t for c in chunks for t in c["choices"][0]["token_ids"]] == expected
    assert chunks[-1]["choices"][0]["finish_reason"] == whole["finish_reason"]
    assert chunks[-1]["usage"]["completion_tokens"] == len(expected)


def test_beams_sampling_and_stop_strings_equal_the_library(server, decoder):
    prompt, model_tok = "the old fox", decoder[1]
    with server.client() as client:
        beams = client.post("/generate", json={"model": "gen", "prompt": prompt, "max_new_tokens": 12,
                                               "num_beams": 3}).json()
        sampling = {"model": "gen", "prompt": prompt, "max_new_tokens": 12, "temperature": 0.9, "top_k": 20,
                    "seed": 7}
        sampled = [client.post("/generate", json=sampling).json() for _ in range(2)]
        greedy = client.post("/generate", json={"model": "gen", "prompt": prompt,
                                                "max_new_tokens": 20}).json()
        stop = greedy["text"][5:8]
        stopped = client.post("/generate", json={"model": "gen", "prompt": prompt, "max_new_tokens": 20,
                                                 "stop": [stop]}).json()
    assert beams["token_ids"] == _offline(decoder, prompt, max_new_tokens=12, num_beams=3)
    expected = _offline(decoder, prompt, max_new_tokens=12, do_sample=True, temperature=0.9, top_k=20,
                        generator=torch.Generator().manual_seed(7))
    assert sampled[0]["token_ids"] == sampled[1]["token_ids"] == expected
    assert stopped["text"] == greedy["text"][:greedy["text"].index(stop)]
    assert stopped["finish_reason"] == "stop" and len(stopped["token_ids"]) < 20
    prompt_ids = model_tok.encode(prompt, add_special_tokens=False).ids
    joined = continuation(model_tok, prompt_ids, stopped["token_ids"])  # after the prompt's, as the CLI does
    assert joined.startswith(stopped["text"])


def test_a_sampled_reply_says_its_seed_and_the_seed_gives_it_again(server):
    """A request that samples without a seed is answered with the seed drawn for it: sent back, it gives
    the same text (on /generate, streamed or not, and /v1/completions); greedy replies say none."""
    sampling = {"model": "gen", "prompt": "the old fox", "temperature": 1.0, "top_k": 50}
    with server.client() as client:
        first = client.post("/generate", json={**sampling, "max_new_tokens": 12}).json()
        again = client.post("/generate", json={**sampling, "max_new_tokens": 12,
                                               "seed": first["seed"]}).json()
        events = client.post("/generate", json={**sampling, "max_new_tokens": 12, "seed": first["seed"],
                                                "stream": True}).text
        greedy = client.post("/generate", json={"model": "gen", "prompt": "the old fox", "max_new_tokens": 4})
        completion = client.post("/v1/completions", json={**sampling, "max_tokens": 12}).json()["choices"][0]
        repeated = client.post("/v1/completions", json={**sampling, "max_tokens": 12,
                                                        "seed": completion["seed"]}).json()["choices"][0]
    assert isinstance(first["seed"], int) and again["token_ids"] == first["token_ids"]
    last = json.loads([line for line in events.splitlines() if line.startswith("data: {")][-1][6:])
    assert last["seed"] == first["seed"] and last["text"] == first["text"]
    assert greedy.json()["seed"] is None
    assert repeated["token_ids"] == completion["token_ids"] and repeated["seed"] == completion["seed"]


def test_every_decoding_setting_of_the_command_line_is_served_alike(server, decoder):
    prompt = "the old fox"
    settings = {"max_new_tokens": 8, "num_beams": 3, "early_stopping": "never", "min_length": 9}
    with server.client() as client:
        served = client.post("/generate", json={"model": "gen", "prompt": prompt, **settings}).json()
        sampling = client.post("/generate", json={"model": "gen", "prompt": prompt, "do_sample": True})
    assert served["token_ids"] == _offline(decoder, prompt, **settings)
    # sampling is said by temperature on the server (0: greedy, > 0: samples)
    assert sampling.status_code == 422 and sampling.json()["error"]["param"] == "do_sample"


def test_openapi_spec_docs_and_page_are_complete_and_offline(server):
    with server.client() as client:
        spec = client.get("/openapi.json").json()
        docs, swagger, page = client.get("/docs").text, client.get("/docs/swagger").text, client.get("/").text
        info, health = client.get("/info").json(), client.get("/health").json()
    routes = {"/v1/embeddings", "/embed", "/predict", "/fill_mask", "/generate", "/v1/completions",
              "/tokenize", "/health", "/info", "/metrics", "/attention", "/v1/models"}
    assert routes <= set(spec["paths"])
    for path in routes:
        for method, op in spec["paths"][path].items():
            assert op.get("summary") and op.get("description"), path
            assert "200" in op["responses"], path
            if method == "post":
                schema = op["requestBody"]["content"]["application/json"]["schema"]["$ref"].split("/")[-1]
                assert spec["components"]["schemas"][schema]["properties"], path
                assert {"413", "422", "429"} <= set(op["responses"]), path
    assert "text/event-stream" in spec["paths"]["/generate"]["post"]["responses"]["200"]["content"]
    for html in (docs, page):
        assert "<script src" not in html and "<link" not in html and "cdn" not in html.lower()
    assert "/openapi.json" in docs and "cdn" in swagger  # Swagger UI stays available for online use
    assert set(info["models"]) == set(health["models"]) == {"enc", "gen", "t5", "cls", "tag", "qa", "plain",
                                                            "calibrated"}
    assert info["models"]["qa"]["task"]["kind"] == "qa" and "predict" in info["models"]["qa"]["capabilities"]
    assert info["limits"]["max_batch_tokens"] == 256 and info["limits"]["batch_wait_ms"] == 5
    # counts stay counts
    assert all(type(v) is int for k, v in info["limits"].items() if k != "batch_wait_ms")


def test_tokenize_and_metrics_text(server, model_dirs):
    tokenizer = lmforge.load_tokenizer(model_dirs["enc"])
    with server.client() as client:
        got = client.post("/tokenize", json={"model": "enc", "text": "the cat sat"}).json()
        text = client.get("/metrics")
    assert got["ids"] == tokenizer.encode("the cat sat").ids and got["count"] == len(got["ids"])
    assert text.headers["content-type"].startswith("text/plain; version=0.0.4")
    families = parse_prometheus(text.text)
    for family in ("lmforge_requests_total", "lmforge_request_seconds", "lmforge_queue_requests",
                   "lmforge_batch_size", "lmforge_batch_tokens", "lmforge_phase_seconds"):
        assert families[family], family
    phases = {labels["phase"] for _, labels, _ in families["lmforge_phase_seconds"]}
    assert {"queue", "compute", "tokenize"} <= phases


def _view_meta(page: str) -> dict:
    return json.loads(re.search(r'<script type="application/json" id="lmf-meta">(.*?)</script>', page,
                                re.DOTALL).group(1))


@pytest.mark.parametrize("name, query", [("enc", {}), ("enc", {"layers": "1"}), ("gen", {}),
                                         ("t5", {"text_pair": "a dog"})])
def test_attention_view_is_the_analysis_page_of_the_same_maps(server, model_dirs, tmp_path, one_thread,
                                                              name, query):
    text = "the quick dog sat on the mat"
    answer = httpx.get(server.url + "/attention", params={"model": name, "text": text, **query}, timeout=60)
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"].startswith("text/html")
    model, tokenizer = lmforge.load(model_dirs[name]).eval(), lmforge.load_tokenizer(model_dirs[name])
    layers = [int(query["layers"])] if "layers" in query else None
    maps = attention_maps(model, tokenizer, text, pair=query.get("text_pair"), layers=layers)
    maps.title = f"{name}: {text}"
    write_html(maps, tmp_path / "view.html")
    got, expected = _view_meta(answer.text), _view_meta((tmp_path / "view.html").read_text())
    assert got == expected  # the same tokens, groups, layers and notes as the library's own page
    assert [g["layers"] for g in got["groups"]][0] == (layers or list(range(model.config.n_layers)))


def test_attention_view_refuses_bad_layers_and_long_texts(server):
    bad = httpx.get(server.url + "/attention", params={"model": "enc", "text": "a cat", "layers": "7"})
    assert bad.status_code == 422 and bad.json()["error"]["param"] == "layers"
    # past enc's 128 positions, within the request bound: the main server refuses it as the tight one did
    long = httpx.get(server.url + "/attention", params={"model": "enc", "text": "word " * 200})
    assert long.status_code == 413 and long.json()["error"]["param"] == "max_seq_len"
    unknown = httpx.get(server.url + "/attention", params={"model": "nope", "text": "a cat"})
    assert unknown.status_code == 404 and unknown.json()["error"]["param"] == "model"


def test_openai_embeddings_base64_usage_models_and_token_ids(server, model_dirs):
    texts = ["the cat sat on the mat", "a red fox"]
    tokenizer = lmforge.load_tokenizer(model_dirs["enc"])
    with server.client() as client:
        floats = client.post("/v1/embeddings", json={"model": "enc", "input": texts}).json()
        packed = client.post("/v1/embeddings", json={"model": "enc", "input": texts,
                                                     "encoding_format": "base64"}).json()
        ids = client.post("/v1/embeddings", json={"model": "enc", "input": [[5, 6, 7]]})
        # more than it has
        wrong_size = client.post("/v1/embeddings", json={"model": "enc", "input": "x", "dimensions": 4096})
        listed, info = client.get("/v1/models").json(), client.get("/info").json()
    assert floats["object"] == "list" and floats["model"] == "enc"
    assert [d["object"] for d in floats["data"]] == ["embedding"] * 2
    tokens = sum(len(tokenizer.encode(t).ids) for t in texts)
    assert floats["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}
    for plain, b64 in zip(floats["data"], packed["data"]):  # OpenAI's base64: little-endian float32
        decoded = np.frombuffer(base64.b64decode(b64["embedding"]), dtype="<f4")
        assert np.array_equal(decoded, np.asarray(plain["embedding"], dtype=np.float32))
    assert len(floats["data"][0]["embedding"]) == info["models"]["enc"]["embedding_dim"]
    assert ids.status_code == 422 and ids.json()["error"]["param"] == "input"
    assert "token ids" in ids.json()["error"]["message"]
    assert wrong_size.status_code == 422 and wrong_size.json()["error"]["param"] == "dimensions"
    assert listed["object"] == "list"
    assert {m["id"] for m in listed["data"]} == set(info["models"]) and listed["data"][0]["object"] == "model"


@pytest.mark.parametrize("route, body, param", [
    ("/v1/embeddings", {"model": "enc", "input": "a b", "dimensions": True}, "dimensions"),  # was [1.0]
    ("/v1/embeddings", {"model": "enc", "input": "a b", "dimensions": "8"}, "dimensions"),
    ("/v1/completions", {"model": "gen", "prompt": "a", "temperature": True}, "temperature"),
    ("/v1/completions", {"model": "gen", "prompt": "a", "temperature": "1"}, "temperature"),
    ("/v1/completions", {"model": "gen", "prompt": "a", "max_tokens": "5"}, "max_tokens"),
    ("/v1/completions", {"model": "gen", "prompt": "a", "echo": "yes"}, "echo"),
    ("/tokenize", {"model": "enc", "text": "a", "add_special_tokens": "no"}, "add_special_tokens"),
    ("/fill_mask", {"model": "enc", "text": "a [MASK]", "max_span": 4095}, "max_span"),  # the pipeline's
    # nothing to do: 422 naming the route's own field (was "input" on /embed; 413 on /v1/completions)
    ("/embed", {"model": "enc", "texts": []}, "texts"),
    ("/v1/embeddings", {"model": "enc", "input": []}, "input"),
    ("/v1/completions", {"model": "gen", "prompt": []}, "prompt"),
])
def test_a_value_of_another_json_type_is_refused_not_coerced(server, route, body, param):
    with server.client() as client:
        answer = client.post(route, json=body)
    assert answer.status_code == 422 and answer.json()["error"]["param"] == param, answer.text


def test_fill_mask_s_span_bound_is_the_pipeline_s():
    from lmforge.pipelines.fill_mask import MAX_SPAN
    from lmforge.serve.option_schemas import FillMaskRequest

    limits = FillMaskRequest.model_json_schema()["properties"]["max_span"]
    assert limits["maximum"] == MAX_SPAN and limits["minimum"] == 1


def test_fill_mask_and_attention_passes_are_not_counted_as_decoding_steps(server):
    before = metric(server.url, "lmforge_decode_steps_total")
    with server.client() as client:
        assert client.post("/fill_mask",
                           json={"model": "t5", "text": "a <mask> sat", "top_k": 2}).status_code == 200
        assert client.get("/attention", params={"model": "gen", "text": "the cat"}).status_code == 200
        generated = client.post("/generate", json={"model": "gen", "prompt": "the cat", "max_new_tokens": 4,
                                                   "min_new_tokens": 4}).json()
    # the prompt's pass and one per new token but the last (it is never fed back)
    assert metric(server.url, "lmforge_decode_steps_total") - before == len(generated["token_ids"])


@pytest.mark.parametrize("options", [{}, {"temperature": 0.8, "top_k": 20, "seed": 3}])
def test_streamed_completions_equal_the_lmforge_generate_command(server, model_dirs, capsys, options):
    prompt, n = "the small bird", 25
    body = {"model": "gen", "prompt": prompt, "max_tokens": n, "temperature": 0, "stream": True, **options}
    with server.client() as client, client.stream("POST", "/v1/completions", json=body) as response:
        chunks = _events(response)
    flags = [arg for key, value in options.items() for arg in (f"--{key.replace('_', '-')}", str(value))]
    assert main(["generate", "--model", str(model_dirs["gen"]), prompt, "--max-new-tokens", str(n),
                 *(flags or ["--temperature", "0"])]) == 0
    printed = capsys.readouterr().out
    assert printed == prompt + "".join(c["choices"][0]["text"] for c in chunks) + "\n"


@pytest.mark.parametrize("query, field, words", [
    ("model=enc", "text", "text: Field required"),  # was param query.text
    ("model=enc&text=a&text=b", "text", "given twice"),  # was the last one, the first dropped unsaid
    ("model=enc&text=a&layers=0&layers=1", "layers", "given twice"),
    ("model=enc&text=%FF", "text", "not valid Unicode"),  # was read as U+FFFD
    ("model=enc&text=%ED%A0%80", "text", "not valid Unicode"),
    ("model=enc&text=a&layers=%EF%BC%91", "layers", "expected indices"),  # a fullwidth 1 was layer 1
    ("model=enc&text=a&layers=,", "layers", "names no layer"),  # was "maps: ...", param null
    ("model=enc&text=a&text_pair=", "text_pair", "text_pair is empty"),  # was param null, "--pair"
    ("model=enc&text=a&heads=2", "heads", "unknown query parameter"),
])
def test_an_attention_query_is_refused_naming_its_parameter(local, query, field, words):
    answer = local.get("/attention?" + query)
    assert answer.status_code == 422, answer.text[:200]
    error = answer.json()["error"]
    assert error["param"] == field and words in error["message"] and "\n" not in error["message"]
