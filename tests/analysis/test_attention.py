"""Recorded attention is exactly what the kernels attended with: for every preset family (tiny) and
every sparse pattern at T >= 1,000, the probabilities times v give the output the ordinary forward's
kernel produced (SDPA, blocked, packed), rows are distributions over the keys the mask allows, and
an eager softmax recomputed from the layer's own projections matches within 1e-6."""
import pytest
import torch

import lmforge
from lmforge.analysis.attention import attention_maps, inspecting
from lmforge.data import corpus_text
from lmforge.layers.patterns import pattern_mask
from lmforge.tokenizer import train_tokenizer
from tests.conftest import ALL_PRESETS, tiny_model


def _inputs(model, T=12, lengths=(12, 7)):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, model.config.vocab_size, (len(lengths), T), generator=g)
    mask = (torch.arange(T)[None] < torch.tensor(lengths)[:, None]).long()
    kw = {"decoder_input_ids": ids[:, :8]} if model.config.architecture == "encoder-decoder" else {}
    return ids, mask, kw


def _kernel_outputs(model, ids, mask, kw) -> dict:
    """(stack, kind, layer) -> the attention's merged heads (B, T, H dh) in an ordinary forward;
    layers counted in call order (ALBERT's one block serves every layer)."""
    calls, hooks = {}, []
    for stack_name in ("encoder", "decoder"):
        stack = getattr(model, stack_name, None)
        if stack is None or not hasattr(stack, "blocks"):
            continue
        name = "decoder" if stack.causal else "encoder"
        for block in stack.blocks:
            for kind, attn in (("self", block.attn), ("cross", block.cross_attn)):
                if attn is not None:
                    hooks.append(attn.out.register_forward_pre_hook(
                        lambda m, a, key=(name, kind): calls.setdefault(key, []).append(a[0])))
    with torch.no_grad():
        model(ids, attention_mask=mask, **kw)
    for h in hooks:
        h.remove()
    return {(*key, layer): out for key, outs in calls.items() for layer, out in enumerate(outs)}


def _padded(merged, mask):
    if merged.dim() == 3:
        return merged
    out = merged.new_zeros(*mask.shape, merged.shape[-1])  # packed rows of an unpadded batch
    out[mask.bool()] = merged
    return out


def _assert_probs_give_kernel_output(model, ids, mask, kw):
    """probs @ v is the kernel's output at every real row (but Longformer's global rows under global
    projections: those attend through their own v, checked by _assert_eager_softmax)."""
    expected = _kernel_outputs(model, ids, mask, kw)
    skip_rows = None
    if model.config.global_projections and "longformer" in model.encoder.patterns:
        skip_rows = model.encoder._global_tokens(None, *ids.shape, "cpu")
    with torch.no_grad(), inspecting(model, record="all") as inspection:
        model(ids, attention_mask=mask, **kw)
    assert set(inspection.records) == set(expected)
    for key, rec in inspection.records.items():
        H, Hkv = rec.q.shape[1], rec.v.shape[1]
        out = rec.probs @ rec.v.float().repeat_interleave(H // Hkv, dim=1)  # (B, H, Tq, dh)
        merged = out.transpose(1, 2).flatten(2)
        want = _padded(expected[key], mask if key[0] == "encoder" or not kw else torch.ones(ids.shape[0], 8))
        real = (mask if merged.shape[1] == mask.shape[1] else torch.ones(merged.shape[:2])).bool()
        if skip_rows is not None:
            real = real & ~skip_rows
        torch.testing.assert_close(merged[real], want[real].float(), atol=2e-5, rtol=1e-4)
        torch.testing.assert_close(rec.probs.sum(-1), torch.ones(rec.probs.shape[:-1]), atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", ALL_PRESETS)
def test_probabilities_reproduce_each_kernels_output_for_every_preset(name):
    model = tiny_model(name)
    ids, mask, kw = _inputs(model)
    _assert_probs_give_kernel_output(model, ids, mask, kw)


SPARSE = {
    "sliding-window": dict(attention="sliding-window", window=64),
    "dilated": dict(attention="dilated", window=64, dilation=2),
    "longformer": dict(attention="longformer", window=64, n_global_tokens=2),
    "longformer-global-projections": dict(attention="longformer", window=64, n_global_tokens=2,
                                          global_projections=True),
    "bigbird": dict(attention="bigbird", block_size=16, n_random_blocks=2),
    "linformer": dict(attention="linformer", linformer_k=32),
}


def _long_model(overrides):
    torch.manual_seed(0)
    cfg = lmforge.ModelConfig(vocab_size=50, d_model=32, n_layers=2, n_heads=4, d_ff=64, max_seq_len=1024,
                              **overrides)
    return lmforge.build(cfg).eval()


@pytest.mark.parametrize("pattern", list(SPARSE))
def test_sparse_patterns_at_1024_tokens_match_the_blocked_kernel_and_an_eager_softmax(pattern):
    model = _long_model(SPARSE[pattern])
    T = 1024
    ids, mask, kw = _inputs(model, T, (T, 900))
    _assert_probs_give_kernel_output(model, ids, mask, kw)
    _assert_eager_softmax(model, ids, mask)


def _assert_eager_softmax(model, ids, mask):
    """The first layer's probabilities from its own q, k projections and the pattern's mask."""
    cfg, attn = model.config, model.encoder.blocks[0].attn
    seen = {}
    hook = attn.qkv.register_forward_pre_hook(lambda m, a: seen.__setitem__("x", a[0]))
    with torch.no_grad(), inspecting(model, record={0}) as inspection:
        model(ids, attention_mask=mask)
    hook.remove()
    x, probs = _padded(seen["x"], mask), inspection.records[("encoder", "self", 0)].probs
    B, T, _ = x.shape
    q, k, _ = attn.qkv(x).view(B, T, 3, cfg.n_heads, -1).permute(2, 0, 3, 1, 4)  # (B, H, T, dh) each
    if cfg.attention == "linformer":
        k = torch.einsum("kn,bhnd->bhkd", attn.linformer.E, k * mask[:, None, :, None])
        allowed = torch.ones(1, 1, T, k.shape[2], dtype=torch.bool)
    else:
        pos = torch.arange(T)
        allowed = pattern_mask(cfg, cfg.attention, pos, pos, False,
                               model.encoder._global_tokens(None, B, T, "cpu"), 0)
        allowed = allowed & mask.bool()[:, None, None, :]
    scores = (q @ k.transpose(-1, -2) / cfg.head_dim ** 0.5).masked_fill(~allowed, float("-inf"))
    eager = torch.softmax(scores.double(), -1).float()
    rows = mask.bool()
    if cfg.global_projections:  # global rows: from the global projections over every real key
        gq, gk, _ = attn.global_qkv(x).view(B, T, 3, cfg.n_heads, -1).permute(2, 0, 3, 1, 4)
        gs = (gq @ gk.transpose(-1, -2) / cfg.head_dim ** 0.5).masked_fill(~mask.bool()[:, None, None],
                                                                           -torch.inf)
        eager[:, :, :2] = torch.softmax(gs.double(), -1).float()[:, :, :2]
    torch.testing.assert_close(probs.permute(0, 2, 1, 3)[rows], eager.permute(0, 2, 1, 3)[rows],
                               atol=1e-6, rtol=0)
    outside = ~allowed.expand_as(probs).clone()
    if cfg.global_projections:
        outside[:, :, :2] = ~mask.bool()[:, None, None]
    outside &= rows[:, None, :, None]  # padded queries see no key: their rows are meaningless
    assert (probs[outside] == 0).all()  # nothing outside the pattern: the sparse mask is in the record


def test_recording_changes_no_output_and_chosen_layers_only():
    model = tiny_model("gpt2")
    ids, mask, _ = _inputs(model)
    plain = model(ids, attention_mask=mask).last_hidden_state
    out = model(ids, attention_mask=mask, return_attention=[1])
    # dense masks rather than unpadded rows while recording: the same sums in another order
    torch.testing.assert_close(out.last_hidden_state, plain, atol=1e-6, rtol=1e-5)
    assert out.attentions[0] is None and out.attentions[1].shape == (2, 4, 12, 12)
    assert model.inspection is None


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(corpus_text(200, seed=0).splitlines(), "wordpiece", 300)


@pytest.mark.parametrize("name,groups", [("bert-base", ["self"]), ("llama-3.2-1b", ["self"]),
                                         ("t5-small", ["encoder", "decoder", "cross"])])
def test_attention_maps_name_tokens_and_expand_gqa_keys(tokenizer, name, groups):
    model = tiny_model(name, vocab_size=300)
    maps = attention_maps(model, tokenizer, "the cat sat on the mat", pair="a dog ran", layers=[1])
    assert [g.name for g in maps.groups] == groups
    for g in maps.groups:
        assert g.layers == [1]
        H = model.config.n_heads
        assert g.probs[0].shape == (H, len(g.rows), len(g.cols))
        assert g.queries[0].shape[0] == g.keys[0].shape[0] == H  # GQA keys repeated per query head
        scores = g.queries[0] @ g.keys[0].transpose(-1, -2) * g.scale
        if name == "bert-base":  # no position bias: q.k is the whole score
            torch.testing.assert_close(torch.softmax(scores, -1), g.probs[0], atol=1e-6, rtol=0)
    if name == "bert-base":
        assert maps.groups[0].rows[0] == "[CLS]" and "[SEP]" in maps.groups[0].rows


def test_attention_maps_refuse_bad_layers_and_empty_text(tokenizer):
    model = tiny_model("bert-base", vocab_size=300)
    with pytest.raises(ValueError, match=r"^layers \[5\] outside"):
        attention_maps(model, tokenizer, "a text", layers=[5])
    with pytest.raises(ValueError, match="empty"):
        attention_maps(model, tokenizer, "  ")
    with pytest.raises(ValueError, match=r"^pair is empty"):
        attention_maps(model, tokenizer, "a text", pair=" ")  # was read as [CLS] a text [SEP] [SEP]


@pytest.mark.parametrize("spec, layers", [
    ("0", [0]), ("1,0,1", [0, 1]), ("0-1", [0, 1]), ("0, 1-1", [0, 1]),
    ("1-0", None), ("2", None), ("0-99999999", None), ("\uff11", None), ("\u0661", None), (",", None),
    ("0-", None), ("-1", None), ("a", None), ("1.0", None),
])
def test_the_command_line_and_the_server_read_layers_alike(spec, layers):
    from lmforge.analysis.attention import layer_list
    from lmforge.cli.analysis import _layers
    from lmforge.cli.common import UsageError
    from lmforge.config.options import OptionsError
    from lmforge.serve.limits import Limits, RequestError
    from lmforge.serve.routes import parse_layers

    model = lmforge.build(lmforge.tiny("bert-base", n_layers=2))
    verdicts = []
    faces = ((lambda: layer_list(spec, 2), OptionsError), (lambda: _layers(spec, model), UsageError),
             (lambda: parse_layers(spec, model, Limits()), RequestError))
    for read, refused in faces:
        try:
            verdicts.append(read())
        except refused as err:  # each face's own error, naming layers
            assert "layers" in str(err) or getattr(err, "field", None) == "layers"
            verdicts.append(None)
    assert verdicts == [layers] * 3


@pytest.mark.parametrize("name", ALL_PRESETS)
def test_recorded_maps_are_zero_at_padding_keys_future_keys_and_outside_the_window(name):
    """Per layer (B, H, Tq, Tk); a real query gives a padding key exactly 0, a causal query every later
    key exactly 0, and a sliding-window layer every key outside its band exactly 0 (not merely small)."""
    model = tiny_model(name)
    ids, mask, kw = _inputs(model)
    cfg = model.config
    with torch.no_grad(), inspecting(model, record="all") as inspection:
        model(ids, attention_mask=mask, **kw)
    depth = {"encoder": cfg.n_layers, "decoder": cfg.decoder_layers if kw else cfg.n_layers}
    for stack, kind in {key[:2] for key in inspection.records}:
        assert sorted(k[2] for k in inspection.records if k[:2] == (stack, kind)) == list(range(depth[stack]))
    for (stack, kind, layer), rec in inspection.records.items():
        p = rec.probs
        Tq = 8 if kw and stack == "decoder" else 12
        Tk = 12 if stack == "encoder" or kind == "cross" or not kw else 8
        if cfg.attention == "linformer":  # a query attends over the k projections of the keys, all real
            assert p.shape == (2, cfg.n_heads, Tq, cfg.linformer_k)
            assert torch.allclose(p.sum(-1), torch.ones(()), atol=1e-5)
            continue
        assert p.shape == (2, cfg.n_heads, Tq, Tk)
        if Tk == 12:  # keys of the padded input: sentence 1 has 7 real tokens
            real_rows = 7 if Tq == 12 else Tq
            assert (p[1, :, :real_rows, 7:] == 0).all()
        if stack == "decoder" and kind == "self":
            assert (p[..., torch.ones(Tq, Tk, dtype=torch.bool).triu(1)] == 0).all()
            if cfg.attention == "sliding-window":
                pos = torch.arange(Tq)
                band = (pos[:, None] - pos[None]) < cfg.layer_window(layer)
                assert (p[..., ~band] == 0).all() and not band.all()


def test_an_encoder_decoder_without_start_ids_is_read_as_generate_reads_it(tokenizer):
    """A T5 whose config names no decoder_start_token_id nor pad was refused (asking for an option the view
    lacks) where `lmforge generate` and /generate start from the tokenizer's pad: the view's decoder reads
    the continuation they give."""
    from lmforge.generate.text import tokenizer_ids
    from lmforge.heads import attach

    model = tiny_model("t5-small", vocab_size=300)
    attach(model, "lm")
    assert model.config.decoder_start_token_id is None and model.config.pad_token_id is None
    ids = torch.tensor([tokenizer.encode("the cat sat").ids])
    with pytest.warns(UserWarning, match="starts from the pad token"):
        want = lmforge.generate(model, ids, max_new_tokens=4, **tokenizer_ids(model, tokenizer))
        maps = attention_maps(model, tokenizer, "the cat sat", max_new_tokens=4)
    decoder = next(g for g in maps.groups if g.name == "decoder")
    assert decoder.rows == [tokenizer.id_to_token(i) for i in want[0].tolist()]
    paired = attention_maps(model, tokenizer, "the cat sat", pair="a dog")
    start = next(g for g in paired.groups if g.name == "decoder").rows[0]
    assert start == tokenizer.id_to_token(tokenizer.pad_id)


@pytest.mark.parametrize("kwargs, field, said", [
    ({"text": 5}, "text", "text must be a text, got int"),  # was "the text ... is empty"
    ({"text": "a \ud800"}, "text", "text is not valid Unicode: surrogates not allowed"),
    ({"text": "a", "pair": 5}, "pair", "pair must be a text, got int"),
    ({"text": "a", "pair": " "}, "pair", "pair is empty: give the second text, or leave it out"),
    ({"text": "a", "layers": [5]}, "layers", "layers [5] outside the model's layers 0..1"),
    ({"text": "a", "layers": "10"}, "layers", "10 is not a layer of this model"),  # was layers 1 and 0
    ({"text": "a", "layers": "x"}, "layers", "expected indices like 0,3,5"),  # was int()'s ValueError
])
def test_attention_maps_refusals_are_options_errors_naming_the_argument(tokenizer, kwargs, field, said):
    """Each was a plain ValueError naming nothing (lmforge.OptionsError did not catch it); a text of layers
    is read as --layers and ?layers= read it."""
    from lmforge.config.options import OptionsError

    model = tiny_model("bert-base", vocab_size=300)
    with pytest.raises(OptionsError) as caught:
        attention_maps(model, tokenizer, **kwargs)
    assert said in str(caught.value) and caught.value.field == field
    assert attention_maps(model, tokenizer, "a", layers="1").groups[0].layers == [1]


def test_a_bad_layers_value_is_named_as_the_field_from_python_and_as_the_flag_on_the_command_line(tokenizer):
    """attention_maps(layers=[5]) said "--layers [5] ...", a flag the Python caller never gave: from Python
    the field ("layers"), on the command line the flag (--layers), each refusing the same layer."""
    from lmforge.cli.analysis import _layers
    from lmforge.cli.common import UsageError
    from lmforge.config.options import OptionsError

    model = tiny_model("bert-base", vocab_size=300)
    with pytest.raises(OptionsError) as python:
        attention_maps(model, tokenizer, "a", layers=[5])
    assert str(python.value).startswith("layers [5] outside") and "--layers" not in str(python.value)
    with pytest.raises(UsageError) as cli:
        _layers("5", model)
    assert str(cli.value).startswith("--layers ") and "5 is not a layer of this model" in str(cli.value)


def test_an_empty_pair_is_named_as_the_field_from_python(tokenizer):
    """attention_maps(pair=" ") said "(the second text, --pair)", a flag the Python caller never gave: the
    field, pair (the command line says --pair: tests/cli/test_attention_cli.py)."""
    from lmforge.config.options import OptionsError

    model = tiny_model("bert-base", vocab_size=300)
    with pytest.raises(OptionsError) as python:
        attention_maps(model, tokenizer, "a", pair="  ")
    assert str(python.value).startswith("pair is empty") and "--" not in str(python.value)
    assert python.value.field == "pair"
