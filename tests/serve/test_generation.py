"""The generation job (serve/generation.py): what a reply's text, token ids and counts say of each other."""
from __future__ import annotations

import pytest

import lmforge
from lmforge.generate.text import continuation, prompt_ids


@pytest.mark.parametrize("beams", [1, 3])
def test_a_stop_string_ends_the_token_ids_where_it_ends_the_text(local, model_dirs, beams):
    """Stopped by a stop string, a reply's token_ids (and completion_tokens) are the fewest ids whose text
    holds it, with beam search as with greedy: not the whole beam, whose text goes on past the stop."""
    tokenizer, body = lmforge.load_tokenizer(model_dirs["gen"]), {"model": "gen", "prompt": "the old fox",
                                                                    "max_new_tokens": 12, "num_beams": beams}
    whole = local.post("/generate", json=body).json()
    stop = whole["text"][3:7]
    stopped = local.post("/generate", json={**body, "stop": stop}).json()
    ids, start = stopped["token_ids"], prompt_ids(tokenizer, body["prompt"], False)
    assert stopped["finish_reason"] == "stop" and stop in whole["text"]
    assert stop in continuation(tokenizer, start, ids) and stop not in continuation(tokenizer, start, ids[:-1])
    assert stopped["usage"]["completion_tokens"] == len(ids) < len(whole["token_ids"])
