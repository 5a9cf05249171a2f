"""LeanDecoder's cached steps equal the general forward they replace (no timings here: see bench/)."""
import pytest
import torch

import lmforge
from lmforge.generate.fast.lean import LeanDecoder, lean_decoding_supported
from lmforge.generate import generate
from lmforge.heads import attach
from lmforge.layers.attention import KVCache
from lmforge.presets import PRESETS


def _families(architecture: str) -> dict:
    """One tiny config per distinct family of `architecture` among the presets."""
    configs, seen = {}, []
    for name in PRESETS:
        # a window shorter than prompt + new tokens, so the sliding window hides keys while decoding
        cfg = lmforge.tiny(name, window=4, eos_token_id=None, decoder_start_token_id=0)
        if cfg.architecture == architecture and cfg.canonical() not in seen:
            seen.append(cfg.canonical())
            configs[name] = cfg
    return configs


DECODERS = {**_families("decoder"),
            "gpt2-shared-layers": lmforge.tiny("gpt2", share_layers=True, eos_token_id=None),
            "gpt2-rmsnorm-no-bias": lmforge.tiny("gpt2", norm="rmsnorm", attention_bias=False,
                                                 ffn_bias=False, eos_token_id=None)}
ENCODER_DECODERS = _families("encoder-decoder")


def _model(name: str):
    torch.manual_seed(0)
    model = lmforge.build({**DECODERS, **ENCODER_DECODERS}[name])
    if model.config.tied_logit_scale:  # T5's N(0, 1) token table makes a random model say only token 0
        torch.nn.init.normal_(model.tokens.weight, std=0.02)
    attach(model, "lm")
    return model.eval()


def _left_padded(vocab: int, lengths=(7, 4, 2)):
    T = max(lengths)
    ids = torch.randint(3, vocab, (len(lengths), T), generator=torch.Generator().manual_seed(1))
    mask = (torch.arange(T)[None] >= T - torch.tensor(lengths)[:, None]).long()
    return ids, mask


def test_the_presets_decoders_are_all_served():
    assert {"gpt2", "openai-gpt", "llama-3.2-1b", "mistral-7b", "bloom-560m"} <= set(DECODERS)
    assert {"t5-small", "bart-base"} <= set(ENCODER_DECODERS)
    assert all(lean_decoding_supported(lmforge.build(cfg))
               for cfg in [*DECODERS.values(), *ENCODER_DECODERS.values()])


@pytest.mark.parametrize("name", DECODERS)
@pytest.mark.parametrize("new", [1, 3])
def test_lean_steps_equal_the_models_cached_forward(name, new):
    model = _model(name)
    ids, mask = _left_padded(model.config.vocab_size)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    general, lean = KVCache(), KVCache()
    step = LeanDecoder(model)
    with torch.no_grad():
        model(ids, mask, position_ids=positions, cache=general, run_heads=False)
        model(ids, mask, position_ids=positions, cache=lean, run_heads=False)
        for _ in range(3):  # `new` positions per step after the left-padded prompt
            tokens = torch.randint(3, model.config.vocab_size, (ids.shape[0], new))
            mask = torch.cat([mask, torch.ones_like(tokens)], dim=1)
            positions = torch.cat([positions, positions[:, -1:] + torch.arange(1, new + 1)], dim=1)
            expected = model(tokens, mask, position_ids=positions[:, -new:], cache=general,
                             run_heads=False).last_hidden_state
            got = step(tokens, mask, positions[:, -new:], lean)
            torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert lean.length == general.length
    for layer, (k, v) in general.self_kv.items():
        torch.testing.assert_close(lean.self_kv[layer][0], k, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(lean.self_kv[layer][1], v, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ENCODER_DECODERS)
def test_encoder_decoder_lean_steps_equal_the_models_cached_forward(name):
    model = _model(name)
    source, mask = _left_padded(model.config.vocab_size)
    mask = mask.flip(1)  # an encoder reads right-padded text
    gen = torch.Generator().manual_seed(2)
    tokens = torch.randint(3, model.config.vocab_size, (source.shape[0], 4), generator=gen)
    general, lean = KVCache(), KVCache()
    step = LeanDecoder(model, mask)
    with torch.no_grad():
        memory = model.encode(source, mask)
        for cache in (general, lean):  # the first step caches the encoder's keys and values
            model(attention_mask=mask, decoder_input_ids=tokens[:, :1], encoder_output=memory, cache=cache,
                  run_heads=False)
        for t in range(1, tokens.shape[1]):
            expected = model(attention_mask=mask, decoder_input_ids=tokens[:, t:t + 1], encoder_output=memory,
                             cache=general, run_heads=False).last_hidden_state
            got = step(tokens[:, t:t + 1], None, None, lean)
            torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="first"):
        step(tokens[:, :1], None, None, KVCache())


@pytest.mark.parametrize("name", [*DECODERS, *ENCODER_DECODERS])
def test_generation_gives_the_same_tokens_with_and_without_lean_steps(name, monkeypatch):
    model = _model(name)
    ids, mask = _left_padded(model.config.vocab_size)
    if model.config.architecture == "encoder-decoder":
        mask = mask.flip(1)
    steps = []  # lean steps actually taken: every step after the first, and none when switched off
    run = LeanDecoder.__call__

    def counted(self, *args, **kwargs):
        steps.append(1)
        return run(self, *args, **kwargs)

    monkeypatch.setattr(LeanDecoder, "__call__", counted)
    for options in ({}, {"num_beams": 3, "num_return_sequences": 2}, {"prefix_lm": True}):
        if options.get("prefix_lm") and (model.config.attention != "full" or name in ENCODER_DECODERS):
            continue  # a prefix LM is a decoder's, with full attention
        model.fast.lean_decoding = True
        steps.clear()
        lean = generate(model, ids, mask, max_new_tokens=8, eos_token_id=None, **options)
        assert len(steps) == 7, options
        model.fast.lean_decoding = False
        steps.clear()
        general = generate(model, ids, mask, max_new_tokens=8, eos_token_id=None, **options)
        assert not steps and torch.equal(lean, general), options


def test_lean_steps_are_for_eval_mode_decoders_only():
    model = _model("gpt2")
    with pytest.raises(ValueError, match="eval"):
        LeanDecoder(model.train())
    encoder = lmforge.build(lmforge.tiny("bert-tiny"))
    assert not lean_decoding_supported(encoder)
    with pytest.raises(ValueError, match="plain self-attention"):
        LeanDecoder(encoder.eval())
