import pytest
import torch

import lmforge
from lmforge.generate import filter_top_k, filter_top_p, generate, next_tokens, penalise_repetition, Sampling
from lmforge.heads import attach

from tests.parity.helpers import save_reference, transformers


def _left_padded(vocab=99, lengths=(7, 4, 2), seed=0):
    gen = torch.Generator().manual_seed(seed)
    T = max(lengths)
    ids = torch.randint(3, vocab, (len(lengths), T), generator=gen)
    mask = (torch.arange(T)[None] >= T - torch.tensor(lengths)[:, None]).long()
    return ids.masked_fill(mask == 0, 1), mask


def _gpt2(tmp_path, **kw):
    torch.manual_seed(0)
    reference = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=99, n_embd=32, n_layer=2, n_head=4, n_positions=64, pad_token_id=1, **kw))
    return reference.eval(), lmforge.load(save_reference(reference, tmp_path))


@pytest.mark.parametrize("eos", [0, 2])
def test_greedy_matches_reference_on_left_padded_batch(tmp_path, eos):
    reference, model = _gpt2(tmp_path, bos_token_id=eos, eos_token_id=eos)
    ids, mask = _left_padded()
    theirs = reference.generate(ids, attention_mask=mask, max_new_tokens=20, do_sample=False)
    ours = generate(model, ids, mask, max_new_tokens=20)
    assert torch.equal(ours, theirs)


def test_greedy_stops_at_eos_and_pads_finished_rows(tmp_path):
    reference, model = _gpt2(tmp_path)
    ids, mask = _left_padded()
    free = generate(model, ids, mask, max_new_tokens=12, eos_token_id=None)
    stop = int(free[0, ids.shape[1] + 2])  # the third token of row 0 becomes a stop token
    out = generate(model, ids, mask, max_new_tokens=12, eos_token_id=stop, pad_token_id=1)
    theirs = reference.generate(ids, attention_mask=mask, max_new_tokens=12, do_sample=False,
                                eos_token_id=stop, pad_token_id=1)
    assert torch.equal(out, theirs)
    row = out[0, ids.shape[1]:]
    first = int((row == stop).nonzero()[0])
    assert first <= 2 and bool((row[first + 1:] == 1).all())


def test_cached_decoding_equals_full_recomputation():
    torch.manual_seed(0)
    for name in ("gpt2", "llama-3.2-1b"):
        model = lmforge.build(lmforge.tiny(name)).eval()
        attach(model, "lm")
        ids = torch.randint(0, 99, (2, 5))
        out = generate(model, ids, max_new_tokens=6)
        with torch.no_grad():  # each new token is the argmax of a full forward over the prefix
            for t in range(5, out.shape[1]):
                assert int(model(out[:1, :t]).logits[0, -1].argmax()) == int(out[0, t])


def test_encoder_decoder_returns_decoder_tokens_and_uses_encoder_once():
    torch.manual_seed(0)
    model = lmforge.build(lmforge.tiny("t5-small"), decoder_start_token_id=0).eval()
    attach(model, "lm")
    ids, mask = torch.randint(1, 99, (2, 6)), torch.ones(2, 6, dtype=torch.long)
    mask[1, 4:] = 0
    calls = []
    model.encoder.register_forward_hook(lambda *a: calls.append(1))
    out = generate(model, ids, mask, max_new_tokens=7)
    assert out.shape == (2, 8) and bool((out[:, 0] == 0).all()) and len(calls) == 1
    with torch.no_grad():
        full = model(ids, mask, decoder_input_ids=out[:, :-1]).logits.argmax(-1)
    assert torch.equal(full, out[:, 1:])


def test_sampling_is_seeded_and_streams_every_step():
    torch.manual_seed(0)
    model = lmforge.build(lmforge.tiny("gpt2")).eval()
    attach(model, "lm")
    ids = torch.randint(0, 99, (2, 3))
    seen = []
    runs = [generate(model, ids, max_new_tokens=8, do_sample=True, temperature=0.8, top_k=20, top_p=0.9,
                     generator=torch.Generator().manual_seed(7), streamer=seen.append) for _ in range(2)]
    assert torch.equal(runs[0], runs[1]) and len(seen) == 16
    assert torch.equal(torch.stack(seen[:8], 1), runs[0][:, 3:])


def test_filters_and_penalty_match_reference_processors():
    gen = torch.Generator().manual_seed(0)
    scores, seen = torch.randn(4, 50, generator=gen), torch.randint(0, 50, (4, 9), generator=gen)
    from transformers.generation import logits_process as lp

    torch.testing.assert_close(penalise_repetition(scores, seen, 1.3),
                               lp.RepetitionPenaltyLogitsProcessor(1.3)(seen, scores.clone()))
    torch.testing.assert_close(filter_top_k(scores, 5), lp.TopKLogitsWarper(5)(seen, scores.clone()))
    torch.testing.assert_close(filter_top_p(scores, 0.7), lp.TopPLogitsWarper(0.7)(seen, scores.clone()))
    assert int((filter_top_k(scores, 5) > float("-inf")).sum(-1).min()) == 5


def test_top_p_keeps_at_least_one_token_and_greedy_ignores_temperature():
    scores = torch.tensor([[10.0, 0.0, 0.0]])
    assert int((filter_top_p(scores, 0.01) > float("-inf")).sum()) == 1
    assert int(next_tokens(scores, torch.zeros(1, 1, dtype=torch.long), Sampling(temperature=5.0))) == 0


def test_bad_requests_are_refused():
    model = lmforge.build(lmforge.tiny("gpt2")).eval()
    with pytest.raises(ValueError, match="language-modelling head"):
        generate(model, torch.zeros(1, 3, dtype=torch.long))
    attach(model, "lm")
    with pytest.raises(ValueError, match="max_seq_len"):
        generate(model, torch.zeros(1, 3, dtype=torch.long), max_new_tokens=model.config.max_seq_len)
    for bad in (dict(temperature=0), dict(top_p=0), dict(max_new_tokens=0)):
        with pytest.raises(ValueError):
            generate(model, torch.zeros(1, 3, dtype=torch.long), do_sample=True, **bad)
    t5 = lmforge.build(lmforge.tiny("t5-small"))
    attach(t5, "lm")
    with pytest.raises(ValueError, match="decoder_start_token_id"):
        generate(t5, torch.zeros(1, 3, dtype=torch.long))
