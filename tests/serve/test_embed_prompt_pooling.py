"""POST /embed gives lmforge.embed's vectors where the model leaves a prompt out of its pooling
(sentence-transformers' include_prompt false): the route puts the prompt in the texts, so it tells the
worker how many leading tokens each text's prompt takes. Served once pooled them (up to 0.083 apart)."""
from __future__ import annotations

import threading

import pytest
import torch

import lmforge
from tests.pipelines.test_embed import tiny_st_dir

fastapi = pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from lmforge.serve import create_app, load_served  # noqa: E402
from lmforge.serve.limits import Limits  # noqa: E402

TEXTS = ["abc def", "the dog"]  # the model reads 16 tokens
PROMPTS = ["x y ", "a b c "]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny mean-pooled sentence-transformers model that leaves the prompt out (include_prompt false)."""
    return tiny_st_dir(tmp_path_factory.mktemp("leave-out") / "m", {"pooling_mode": "mean",
                                                                    "include_prompt": False})


def _served(client, prompt: str, texts=TEXTS) -> torch.Tensor:
    answer = client.post("/embed", json={"model": "e", "texts": texts, "prompt": prompt})
    assert answer.status_code == 200, answer.text
    return torch.tensor(answer.json()["embeddings"])


@pytest.mark.parametrize("prompt", PROMPTS + [""])
def test_served_vectors_leave_the_prompt_out_as_lmforge_embed(model_dir, prompt):
    with TestClient(create_app({"e": load_served("e", model_dir)}, threads=1)) as client:
        served = _served(client, prompt)
    ours = lmforge.embed(TEXTS, model=model_dir, prompt=prompt)
    assert torch.allclose(served, ours, atol=1e-5), (served - ours).abs().max().item()


def test_two_prompts_in_one_batch_each_leave_their_own_out(model_dir):
    served_model = load_served("e", model_dir)
    calls, real = [], served_model.encoder.embed_counted

    def counted(texts, *args, **kwargs):
        calls.append(len(texts))
        return real(texts, *args, **kwargs)

    served_model.encoder.embed_counted = counted
    found = {}
    limits = Limits(batch_wait_ms=3000.0)  # the worker waits for the second request, then runs both at once
    with TestClient(create_app({"e": served_model}, limits, threads=1, workers=1)) as client:
        posts = [threading.Thread(target=lambda p=p: found.update({p: _served(client, p, [p + "!"] + TEXTS)}))
                 for p in PROMPTS]
        for post in posts:
            post.start()
        for post in posts:
            post.join()
    assert calls == [2 * (len(TEXTS) + 1)], calls  # one batch held both requests' texts
    for prompt in PROMPTS:
        ours = lmforge.embed([prompt + "!"] + TEXTS, model=model_dir, prompt=prompt)
        assert torch.allclose(found[prompt], ours, atol=1e-5), (found[prompt] - ours).abs().max().item()


def test_a_chunked_text_with_a_left_out_prompt_is_refused_as_lmforge_embed_refuses_it(model_dir):
    long, asked = "abc def ghi jkl mno pqr", {"prompt": "x y ", "truncate": "chunk"}  # windows of 16 tokens
    with pytest.raises(lmforge.OptionsError) as refused:
        lmforge.embed([long], model=model_dir, **asked)
    with TestClient(create_app({"e": load_served("e", model_dir)}, threads=1)) as client:
        answer = client.post("/embed", json={"model": "e", "texts": [long], **asked})
    assert answer.status_code == 422 and answer.json()["error"]["param"] == refused.value.field == "truncate"
    assert answer.json()["error"]["message"] == str(refused.value)
