import pytest
import torch

import lmforge
from lmforge.presets import PRESETS
from lmforge.config.options import OptionsError
from lmforge.generate import generate
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
    reference, model = _gpt2(tmp_path, bos_token_id=None, eos_token_id=None)  # GPT2Config's 50256: past 99
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


def _generators():
    """One tiny model with an LM head per decoder and encoder-decoder family among the presets."""
    models, seen = {}, []
    for name in PRESETS:
        cfg = lmforge.tiny(name, decoder_start_token_id=0)
        if cfg.architecture != "encoder" and cfg.canonical() not in seen:
            seen.append(cfg.canonical())
            torch.manual_seed(0)
            model = lmforge.build(cfg).eval()
            if cfg.tied_logit_scale:  # T5's N(0, 1) token table makes a random model say only token 0
                torch.nn.init.normal_(model.tokens.weight, std=0.02)
            models[name] = attach_lm(model)
    return models


def attach_lm(model):
    """`model` with a (tied) LM head."""
    attach(model, "lm")
    return model


GENERATORS = _generators()


@pytest.mark.parametrize("name", GENERATORS)
def test_cached_generation_equals_uncached_for_every_preset(name):
    model = GENERATORS[name]
    ids, mask = _left_padded(lengths=(6, 3))
    if isinstance(model, lmforge.model.EncoderDecoder):
        mask = mask.flip(1)  # an encoder reads right-padded text
        ids = torch.where(mask.bool(), ids, 0)
    for options in ({}, {"num_beams": 3, "num_return_sequences": 2, "length_penalty": 0.5}):
        stop = int(generate(model, ids, mask, max_new_tokens=5, eos_token_id=None)[0, -2])
        cached = generate(model, ids, mask, max_new_tokens=8, eos_token_id=stop, pad_token_id=0, **options)
        uncached = generate(model, ids, mask, max_new_tokens=8, eos_token_id=stop, pad_token_id=0,
                            use_cache=False, **options)
        assert torch.equal(cached, uncached)


@pytest.mark.parametrize("name", ["gpt2", "t5-small"])
def test_one_beam_and_top_k_one_equal_greedy(name):
    model = GENERATORS[name]
    ids, mask = _left_padded(lengths=(6, 3, 5))
    if name == "t5-small":
        mask = mask.flip(1)
    greedy = generate(model, ids, mask, max_new_tokens=10)
    assert torch.equal(generate(model, ids, mask, max_new_tokens=10, num_beams=1), greedy)
    top1 = generate(model, ids, mask, max_new_tokens=10, do_sample=True, top_k=1, temperature=0.7,
                    generator=torch.Generator().manual_seed(3))
    assert torch.equal(top1, greedy)
    assert not torch.equal(generate(model, ids, mask, max_new_tokens=10, num_beams=4), greedy)


def test_beams_share_one_encoder_pass_and_return_the_best_first():
    model = GENERATORS["t5-small"]
    ids, mask = _left_padded(lengths=(6, 4))
    calls = []
    hook = model.encoder.register_forward_hook(lambda *a: calls.append(1))
    try:
        out = generate(model, ids, mask.flip(1), max_new_tokens=6, num_beams=3, num_return_sequences=3,
                       eos_token_id=None)
    finally:
        hook.remove()
    assert len(calls) == 1 and out.shape == (6, 7) and bool((out[:, 0] == 0).all())
    with torch.no_grad():  # summed log-probabilities of the three hypotheses of each input, best first
        logp = model(ids.repeat_interleave(3, 0), mask.flip(1).repeat_interleave(3, 0),
                     decoder_input_ids=out[:, :-1]).logits.log_softmax(-1)
    scores = logp.gather(-1, out[:, 1:, None]).sum((1, 2)).view(2, 3)
    assert bool((scores[:, :-1] >= scores[:, 1:] - 1e-5).all())


def test_sampling_returns_several_sequences_per_input():
    model = GENERATORS["gpt2"]
    ids, mask = _left_padded(lengths=(4, 2))
    out = generate(model, ids, mask, max_new_tokens=6, do_sample=True, num_return_sequences=3,
                   generator=torch.Generator().manual_seed(0))
    assert out.shape == (6, 10) and torch.equal(out[:, :4], ids.repeat_interleave(3, 0))
    assert len({tuple(row) for row in out[:3, 4:].tolist()}) > 1


# one option per processor; each run differs from plain greedy decoding
PROCESSED = [dict(min_new_tokens=12), dict(no_repeat_ngram_size=2), dict(repetition_penalty=1.8),
             dict(suppress_tokens=[70, 41]), dict(forced_eos_token_id=4),
             dict(min_length=18, num_beams=3, num_return_sequences=3)]


@pytest.mark.parametrize("options", PROCESSED)
def test_processed_generation_matches_reference(tmp_path, options):
    reference, model = _gpt2(tmp_path, bos_token_id=0, eos_token_id=0)
    ids, mask = _left_padded()
    beams = {k: v for k, v in options.items() if k.startswith("num_")}
    free = generate(model, ids, mask, max_new_tokens=12, **beams)
    stop = int(free[0, ids.shape[1]])  # an eos that row 0 produces first unless held back
    theirs = reference.generate(ids, attention_mask=mask, max_new_tokens=12, do_sample=False,
                                eos_token_id=stop, **options)
    ours = generate(model, ids, mask, max_new_tokens=12, eos_token_id=stop, **options)
    assert torch.equal(ours, theirs)
    assert not torch.equal(ours, generate(model, ids, mask, max_new_tokens=12, eos_token_id=stop, **beams))


def test_forced_first_token_of_an_encoder_decoder_matches_reference(tmp_path):
    torch.manual_seed(0)
    reference = transformers.T5ForConditionalGeneration(transformers.T5Config(
        vocab_size=99, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, decoder_start_token_id=0,
        pad_token_id=0, eos_token_id=1)).eval()
    model = lmforge.load(save_reference(reference, tmp_path))
    ids = torch.randint(2, 99, (2, 5))
    for options in (dict(forced_bos_token_id=7), dict(forced_bos_token_id=7, num_beams=3)):
        ours = generate(model, ids, max_new_tokens=5, **options)
        assert torch.equal(ours, reference.generate(ids, max_new_tokens=5, do_sample=False, **options))
        assert bool((ours[:, 1] == 7).all())


def _request(model, ids, **options):
    return generate(model, ids, **{"max_new_tokens": 4, **options})


BAD = [
    (torch.zeros(1, 0, dtype=torch.long), {}, "empty"),
    (torch.zeros(0, 3, dtype=torch.long), {}, "empty"),
    (torch.zeros(3, dtype=torch.long), {}, "shape"),
    (torch.zeros(1, 65, dtype=torch.long), {}, "longer than the context"),
    (torch.zeros(1, 3, dtype=torch.long), dict(max_new_tokens=63), "exceed the context"),
    (torch.full((1, 3), 99), {}, "outside the vocabulary"),
    (torch.full((1, 3), -1), {}, "outside the vocabulary"),
    (torch.zeros(1, 3, dtype=torch.long), dict(do_sample=True, temperature=0.0), "temperature"),
    (torch.zeros(1, 3, dtype=torch.long), dict(do_sample=True, temperature=-1.0), "temperature"),
    (torch.zeros(1, 3, dtype=torch.long), dict(do_sample=True, top_p=0.0), "top_p"),
    (torch.zeros(1, 3, dtype=torch.long), dict(top_p=1.5), "top_p"),
    (torch.zeros(1, 3, dtype=torch.long), dict(top_k=-1), "top_k"),
    (torch.zeros(1, 3, dtype=torch.long), dict(max_new_tokens=0), "max_new_tokens"),
    (torch.zeros(1, 3, dtype=torch.long), dict(num_beams=0), "num_beams"),
    (torch.zeros(1, 3, dtype=torch.long), dict(num_beams=2, do_sample=True), "sampling"),
    (torch.zeros(1, 3, dtype=torch.long), dict(num_beams=2, num_return_sequences=3), "num_return_sequences"),
    (torch.zeros(1, 3, dtype=torch.long), dict(num_return_sequences=2), "num_return_sequences"),
    (torch.zeros(1, 3, dtype=torch.long), dict(num_beams=2, streamer=print), "stream"),
    (torch.zeros(1, 3, dtype=torch.long), dict(num_beams=2, early_stopping="sometimes"), "early_stopping"),
    (torch.zeros(1, 3, dtype=torch.long), dict(eos_token_id=99), "eos_token_id"),
    (torch.zeros(1, 3, dtype=torch.long), dict(forced_eos_token_id=-2), "forced_eos_token_id"),
    (torch.zeros(1, 3, dtype=torch.long), dict(suppress_tokens=[1, 200]), "suppress_tokens"),
    (torch.zeros(1, 3, dtype=torch.long), dict(no_repeat_ngram_size=-1), "no_repeat_ngram_size"),
    (torch.zeros(1, 3, dtype=torch.long), dict(repetition_penalty=0.0), "repetition_penalty"),
    (torch.zeros(2, 3, dtype=torch.long), dict(attention_mask=torch.tensor([[1, 1, 1], [0, 0, 0]])), "row 1"),
    (torch.zeros(2, 3, dtype=torch.long), dict(attention_mask=torch.tensor([[1, 1, 1], [1, 1, 0]])),
     "right-padded"),
    (torch.zeros(2, 3, dtype=torch.long), dict(attention_mask=torch.ones(2, 4)), "does not match"),
    # a mask of other values was read as long: 2 as a token, 0.5 as padding
    (torch.zeros(1, 3, dtype=torch.long), dict(attention_mask=torch.tensor([[1, 2, 1]])), "0 \\(padding\\)"),
    (torch.zeros(1, 3, dtype=torch.long), dict(attention_mask=torch.tensor([[1.0, 0.5, 1.0]])), "and 1"),
    (torch.zeros(1, 3, dtype=torch.long), dict(attention_mask=[[1, 1, 1]]), "must be a tensor"),
]


@pytest.mark.parametrize("ids, options, match", BAD)
def test_bad_requests_get_a_one_line_error_before_any_model_call(ids, options, match):
    model = GENERATORS["gpt2"]
    calls = []
    hook = model.register_forward_pre_hook(lambda *a: calls.append(1))
    try:
        with pytest.raises(ValueError, match=match) as err:
            _request(model, ids, **options)
    finally:
        hook.remove()
    assert "\n" not in str(err.value) and not calls


def test_requests_a_model_cannot_serve_are_refused():
    with pytest.raises(ValueError, match="language-modelling head"):
        generate(lmforge.build(lmforge.tiny("gpt2")), torch.zeros(1, 3, dtype=torch.long))
    t5 = attach_lm(lmforge.build(lmforge.tiny("t5-small")))
    with pytest.raises(ValueError, match="decoder_start_token_id"):
        generate(t5, torch.zeros(1, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="exceed the context"):
        generate(GENERATORS["t5-small"], torch.zeros(1, 3, dtype=torch.long), max_new_tokens=65)
    with pytest.raises(ValueError, match="fill_mask"):
        generate(attach_lm(lmforge.build(lmforge.tiny("bert-tiny"))), torch.zeros(1, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="does not decode XLNet's permutation LM"):  # not told to fill masks
        generate(attach_lm(lmforge.build(lmforge.tiny("xlnet-base"))), torch.zeros(1, 3, dtype=torch.long))


def test_prefix_lm_generation_reads_the_prompt_bidirectionally():
    model = GENERATORS["gpt2"]
    ids, mask = _left_padded(lengths=(6, 3))
    out = generate(model, ids, mask, max_new_tokens=6, eos_token_id=None, prefix_lm=True)
    for options in ({"use_cache": False}, {"num_beams": 1}):
        assert torch.equal(generate(model, ids, mask, max_new_tokens=6, eos_token_id=None, prefix_lm=True,
                                    **options), out)
    # the first new token is the argmax of the last position with the whole prompt as prefix
    with torch.no_grad():
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        hidden = model(ids, mask, position_ids=positions, prefix_lengths=torch.full((2,), ids.shape[1]),
                       run_heads=False).last_hidden_state
        first = model.heads["lm"](hidden[:, -1]).argmax(-1)
        causal = model(ids, mask, position_ids=positions, run_heads=False).last_hidden_state
    assert torch.equal(out[:, ids.shape[1]], first)
    # earlier prompt positions saw later ones, so even the last position's state changes
    assert not torch.allclose(hidden[:, -1], causal[:, -1], atol=1e-4)
    with pytest.raises(OptionsError, match="prefix_lm is for decoders") as err:
        generate(GENERATORS["t5-small"], ids, mask, max_new_tokens=2, prefix_lm=True)
    assert err.value.field == "prefix_lm"


def test_call_options_are_keywords_of_generate_s_fields_and_still_checked(monkeypatch):
    """prefix_lm, use_cache and projection come through **fields (CallOptions' names): the public signature
    has at most 9 named parameters (a review flags 12), and each keyword still reaches decoding or is
    refused naming itself."""
    import importlib
    import inspect

    generation = importlib.import_module("lmforge.generate")  # the module: lmforge.generate is the function
    named = [p for p in inspect.signature(generate).parameters.values() if p.kind != p.VAR_KEYWORD]
    assert len(named) <= 9, [p.name for p in named]
    seen, steps = [], generation.DecoderSteps
    monkeypatch.setattr(generation, "DecoderSteps",
                        lambda *a: seen.append((a[4], a[5], a[6].mode)) or steps(*a))
    ids = torch.tensor([[5, 6, 7]])
    out = generate(GENERATORS["gpt2"], ids, use_cache=False, prefix_lm=True, projection="plain",
                   max_new_tokens=3, eos_token_id=None)
    assert seen == [(False, True, "plain")] and out.shape == (1, 6)
    for given in ({"projection": "fast"}, {"use_cache": "no"}, {"prefix_lm": 1}, {"use_kache": True}):
        with pytest.raises(OptionsError) as err:
            generate(GENERATORS["gpt2"], ids, max_new_tokens=3, **given)
        assert err.value.field == next(iter(given)) and next(iter(given)) in str(err.value)
