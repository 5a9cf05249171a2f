"""Contracts that every preset (at tiny size) and every axis value must keep."""
import json

import pytest
import torch

import lmforge
from lmforge.config.options import OptionsError
from lmforge.heads import attach

from tests.conftest import CASES, forward, tiny_model

B, T = 2, 12


def _ids(model, b=B, t=T, seed=0):
    return torch.randint(0, model.config.vocab_size, (b, t), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("name", CASES)
def test_output_shapes(name):
    model = tiny_model(CASES[name])
    attach(model, "lm")
    out = forward(model, _ids(model), return_hidden=True, return_attention=True)
    cfg = model.config
    assert out.last_hidden_state.shape == (B, T, cfg.d_model)
    assert out.logits.shape == (B, T, cfg.vocab_size)
    n_layers = cfg.decoder_layers if cfg.architecture == "encoder-decoder" else cfg.n_layers
    assert len(out.hidden_states) == n_layers + 1
    assert len(out.attentions) == n_layers
    if cfg.attention != "linformer":
        assert out.attentions[0].shape == (B, cfg.n_heads, T, T)
        torch.testing.assert_close(out.attentions[0].sum(-1), torch.ones(B, cfg.n_heads, T))


@pytest.mark.parametrize("name", CASES)
def test_padding_invariance(name):
    """Outputs at real positions do not depend on the pad content or (but for BigBird's
    length-dependent blocks) on the pad amount."""
    model = tiny_model(CASES[name])
    ids = _ids(model, 1, 7)
    alone = forward(model, ids).last_hidden_state
    amounts = [5] if model.config.attention == "bigbird" else [0, 3, 9]
    for pad in amounts:
        for seed in (1, 2):
            padded = torch.cat([ids, _ids(model, 1, pad, seed)], dim=1) if pad else ids
            mask = torch.zeros_like(padded)
            mask[:, :7] = 1
            if model.config.attention == "bigbird":  # compare to the same length, pad content varied
                alone = forward(model, torch.cat([ids, _ids(model, 1, pad, 0)], 1), mask, decoder_mask=mask)
                alone = alone.last_hidden_state
            out = forward(model, padded, mask, decoder_mask=mask).last_hidden_state
            torch.testing.assert_close(out[:, :7], alone[:, :7], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("name", [n for n, c in CASES.items() if c.architecture != "encoder"])
def test_causality(name):
    """Changing token t never changes an output before t (decoder side)."""
    model = tiny_model(CASES[name])
    ids = _ids(model)
    base = forward(model, ids).last_hidden_state
    for t in (0, 5, T - 1):
        changed = ids.clone()
        changed[:, t] = (changed[:, t] + 1) % model.config.vocab_size
        if model.config.architecture == "encoder-decoder":
            out = forward(model, ids, decoder_ids=changed).last_hidden_state
        else:
            out = forward(model, changed).last_hidden_state
        torch.testing.assert_close(out[:, :t], base[:, :t], atol=1e-6, rtol=0)
        assert not torch.allclose(out[:, t:], base[:, t:])


@pytest.mark.parametrize("name", [n for n, c in CASES.items() if c.architecture != "encoder"])
def test_cached_decoding_equals_full_forward(name):
    model = tiny_model(CASES[name])
    ids = _ids(model)
    full = forward(model, ids).last_hidden_state
    if model.config.architecture == "encoder-decoder":
        encoded = model.encode(ids)
        step = lambda tok, cache: model(decoder_input_ids=tok, encoder_output=encoded, cache=cache,
                                        use_cache=True)
    else:
        step = lambda tok, cache: model(tok, cache=cache, use_cache=True)
    out = step(ids[:, :4], None)  # a prompt, then one token at a time
    pieces, cache = [out.last_hidden_state], out.cache
    for t in range(4, T):
        out = step(ids[:, t:t + 1], cache)
        pieces.append(out.last_hidden_state)
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, atol=1e-5, rtol=1e-4)
    assert cache.length == T


@pytest.mark.parametrize("name", CASES)
def test_every_parameter_gets_a_gradient(name):
    model = tiny_model(CASES[name]).train()
    attach(model, "lm")
    out = forward(model, _ids(model))
    out.logits.float().pow(2).mean().backward()
    for pname, p in model.named_parameters():
        if pname.endswith("query_init"):  # XLNet's query stream runs only under the PLM objective
            continue
        assert p.grad is not None, f"{pname} got no gradient"
        assert torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, f"{pname} has a zero gradient"


@pytest.mark.parametrize("name", CASES)
def test_save_load_round_trip_is_exact(name, tmp_path):
    model = tiny_model(CASES[name])
    attach(model, "lm")
    attach(model, "classification", n_labels=3)
    model.save(tmp_path)
    loaded = lmforge.load(tmp_path).eval()
    assert loaded.config == model.config
    a, b = model.state_dict(), loaded.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    ids = _ids(model)
    torch.testing.assert_close(forward(loaded, ids).logits, forward(model, ids).logits, atol=0, rtol=0)


def test_input_errors_are_clear():
    model = tiny_model("bert-base")
    with pytest.raises(ValueError, match="shape \\(batch, length\\)"):
        model(torch.zeros(5, dtype=torch.long))
    with pytest.raises(ValueError, match="exceed max_seq_len=64"):
        model(torch.zeros(1, 65, dtype=torch.long))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        model(torch.full((1, 4), 99))
    with pytest.raises(ValueError, match="attention mask of shape"):
        model(torch.zeros(2, 4, dtype=torch.long), torch.ones(2, 5))
    with pytest.raises(ValueError, match="empty"):
        model(torch.zeros(1, 0, dtype=torch.long))
    for mask in (torch.tensor([[1, 2, 1]]), torch.tensor([[1.0, 0.5, 1.0]])):  # both were read as all 1
        with pytest.raises(ValueError, match=r"^attention_mask must hold 0 \(padding\) and 1 \(a token\)"):
            model(torch.zeros(1, 3, dtype=torch.long), mask)
    with pytest.raises(ValueError, match=r"^position_ids must be in \[0, max_seq_len=64\)$"):  # an IndexError
        model(torch.zeros(1, 2, dtype=torch.long), position_ids=torch.tensor([[0, 64]]))
    roberta = tiny_model("roberta-base")  # RoBERTa's padding row sits before position 0: -1 is a row
    roberta(torch.zeros(1, 2, dtype=torch.long), position_ids=torch.tensor([[-1, 0]]))
    with pytest.raises(ValueError, match=r"^position_ids must be in \[-\d+, max_seq_len="):
        roberta(torch.zeros(1, 2, dtype=torch.long), position_ids=torch.tensor([[-9, 0]]))
    rotary = tiny_model("llama-3.2-1b")  # positions past max_seq_len are rotations, not rows
    rotary(torch.zeros(1, 2, dtype=torch.long), position_ids=torch.tensor([[70, 71]]))
    ones = torch.zeros(1, 3, dtype=torch.long)
    as_float, as_bool = (model(ones, torch.ones(1, 3, dtype=kind)).last_hidden_state  # 0/1 of any dtype
                         for kind in (torch.float32, torch.bool))
    torch.testing.assert_close(as_float, as_bool, atol=0, rtol=0)


def test_only_xlnets_forward_takes_two_stream_inputs():
    import inspect

    from lmforge.layers.inputs import TWO_STREAM_INPUTS
    from lmforge.model import Decoder, Encoder, EncoderDecoder, XLNetEncoder

    for cls in (Encoder, Decoder, EncoderDecoder):
        assert not set(TWO_STREAM_INPUTS) & set(inspect.signature(cls.forward).parameters), cls
    assert set(TWO_STREAM_INPUTS) <= set(inspect.signature(XLNetEncoder.forward).parameters)
    with pytest.raises(ValueError, match="mem_len: two-stream inputs need position='xl-relative'"):
        tiny_model("bert-base")(torch.zeros(1, 4, dtype=torch.long), mem_len=2)


def test_xlnet_refuses_the_reference_inputs_it_does_without_by_name():
    """input_mask / head_mask (the reference XLNetModel's) and the other encoders' position_ids /
    global_tokens were a raw TypeError; each is named with what to pass instead."""
    model, ids = tiny_model("xlnet-base"), torch.zeros(1, 4, dtype=torch.long)
    with pytest.raises(ValueError, match=r"^input_mask: pass attention_mask instead \(it is 1 - input_mask"):
        model(ids, input_mask=torch.zeros(1, 4))
    with pytest.raises(ValueError, match=r"^head_mask: gate heads with lmforge\.layers\.inspection"):
        model(ids, head_mask=torch.ones(2, 2))
    for name in ("position_ids", "global_tokens"):  # the other encoders' inputs it does without
        with pytest.raises(ValueError, match=f"^{name}: XLNet"):
            model(ids, **{name: torch.zeros(1, 4, dtype=torch.long)})
    assert model(ids, attention_mask=torch.ones(1, 4)).last_hidden_state.shape[:2] == (1, 4)  # it runs


def test_the_config_chooses_the_xlnet_class_and_loading_keeps_it(tmp_path):
    from lmforge.model import Encoder, XLNetEncoder, from_config

    cfg = lmforge.tiny("xlnet-base")
    assert type(from_config(cfg)) is XLNetEncoder and type(lmforge.build("xlnet-base", **{
        k: getattr(cfg, k) for k in ("n_layers", "d_model", "n_heads", "d_ff", "vocab_size")
    })) is XLNetEncoder
    assert type(from_config(lmforge.tiny("bert-base"))) is Encoder
    model = tiny_model("xlnet-base")
    model.save(tmp_path)
    assert type(lmforge.load(tmp_path)) is XLNetEncoder


def test_global_tokens_are_a_0_1_mask_of_the_batch_s_shape_on_a_longformer_only():
    """2 and -1 were read as global (the reference reads 2 as local, -1 as padding), a (T,) or (B, T') mask
    failed inside the masks with an IndexError, and models without global attention ignored it."""
    model, ids = tiny_model("longformer-base"), torch.zeros(2, 5, dtype=torch.long)
    model(ids, global_tokens=torch.tensor([[1, 0, 0, 0, 0]] * 2))  # 0 and 1, ints or bools: taken
    for bad in (torch.tensor([[2, 0, 0, 0, 0]] * 2), torch.tensor([[-1, 0, 0, 0, 0]] * 2)):
        with pytest.raises(ValueError, match=r"^global_tokens must hold 0 \(local\) and 1 \(global\) only"):
            model(ids, global_tokens=bad)
    for bad in (torch.ones(5, dtype=torch.bool), torch.ones(2, 4, dtype=torch.bool), [[1, 0, 0, 0, 0]] * 2):
        with pytest.raises(ValueError, match=r"^global_tokens must be a tensor of shape \(batch, length\)"):
            model(ids, global_tokens=bad)
    with pytest.raises(ValueError, match="global_tokens: this model's attention .* has no global tokens"):
        tiny_model("bert-base")(ids, global_tokens=torch.ones(2, 5, dtype=torch.bool))


@pytest.mark.parametrize("cfg", ["gpt2", None, {"architecture": "decoder"}])
def test_from_config_of_no_model_config_is_a_config_error_naming_cfg(cfg):
    """A preset name or a dict as from_config's cfg failed as
    "'str' object has no attribute 'architecture'"."""
    with pytest.raises(lmforge.ConfigError, match="cfg must be a ModelConfig") as caught:
        lmforge.from_config(cfg)
    assert caught.value.field == "cfg"


def test_model_save_names_a_classifiers_outputs_as_lmforge_save_does(tmp_path):
    """model.save(d, format="hf", labels=...) forwards labels: the config names them, checked alike."""
    model = lmforge.build(lmforge.tiny("bert-base"))
    attach(model, "classification", n_labels=2)
    model.save(tmp_path / "hf", format="hf", labels=["spam", "ham"])
    hf = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert hf["id2label"] == {"0": "spam", "1": "ham"} and hf["label2id"] == {"spam": 0, "ham": 1}
    with pytest.raises(OptionsError, match="labels: 3 given"):
        model.save(tmp_path / "three", format="hf", labels=["a", "b", "c"])
    with pytest.raises(OptionsError, match="format=\"hf\" only"):
        model.save(tmp_path / "native", labels=["spam", "ham"])
