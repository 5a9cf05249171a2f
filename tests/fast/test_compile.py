"""torch.compile on a plain and on an optimized model gives the eager model's outputs, for every family.

The default suite compiles an encoder and a decoder with the
aot_eager backend: it traces the model through Dynamo and AOTAutograd, which is where a class swap,
a per-call hook or a Python-side decision would break. The slow suite traces every family, forward
and backward, and compiles one model of each architecture with Inductor, the backend users run
(Inductor's C++ build takes 20 s to minutes a model on 2 cores). ELMo, the one family that is not a
Transformer, compiles with graph breaks (its input checks read values back) and is checked apart.
"""
import pytest
import torch

import lmforge
from lmforge.fast.paths import FastPaths
from lmforge.heads import attach

FAMILIES = ["bert-base", "roberta-base", "albert-base", "distilbert-base", "electra-small", "spanbert-base",
            "xlnet-base", "openai-gpt", "gpt2", "llama-3.2-1b", "mistral-7b", "bloom-560m", "t5-small",
            "bart-base", "transformer-base", "longformer-base", "bigbird-base",
            "linformer-base"]
# what makes a preset's forward differ from another's: a preset unlike every one above needs its own entry
SHAPE = ("architecture", "position", "attention", "norm", "norm_placement", "ffn", "share_layers")


def _shape(name: str) -> tuple:
    cfg = lmforge.get_config(name)
    return tuple(getattr(cfg, field) for field in SHAPE)


def test_the_families_cover_every_preset():
    """Every Transformer preset is built like one of FAMILIES (ELMo has its own test below)."""
    from lmforge.presets import PRESETS

    assert {name: _shape(name) for name in PRESETS if _shape(name) not in set(map(_shape, FAMILIES))} == {}


def _model(name: str):
    torch.manual_seed(0)
    cfg = lmforge.tiny(name)
    if cfg.attention == "bigbird":  # long enough for its blocks at the test's length
        cfg = cfg.replace(max_seq_len=max(cfg.max_seq_len, 64))
    model = lmforge.build(cfg).eval()
    attach(model, "lm")
    return model


def _inputs(model):
    T = 24 if model.config.attention in ("bigbird", "longformer") else 11
    ids = torch.randint(3, model.config.vocab_size, (2, T), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    if model.config.architecture != "decoder":
        mask[1, T - 3:] = 0  # padding: the optimized encoder packs the real tokens
    extra = {"decoder_input_ids": ids[:, :5]} if model.config.architecture == "encoder-decoder" else {}
    return ids, mask, extra


# every family compiles in one graph (fullgraph). BigBird's random blocks are drawn once per length and
# layer, outside the graph: the eager call below draws them (a first compiled call would break there once)


def _compare(name: str, backend: str, optimized: bool, backward: bool = False,
             inference: bool = False) -> tuple:
    """(compiled logits, eager logits) at the real positions, and whether a backward pass through the
    compiled model gave finite gradients (None without backward); the compiled model in one graph,
    under no_grad where `inference` (as an evaluation or a server runs it)."""
    torch._dynamo.reset()
    model = _model(name)
    ids, mask, extra = _inputs(model)
    if optimized:
        lmforge.optimize(model)
    with torch.no_grad():
        want = model(ids, mask, **extra).logits
    with torch.set_grad_enabled(not inference):
        got = torch.compile(model, backend=backend, fullgraph=True)(ids, mask, **extra).logits
    real = mask.bool() if "decoder_input_ids" not in extra else torch.ones(got.shape[:2], dtype=torch.bool)
    finite = None
    if backward:
        got[real].sum().backward()
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        finite = bool(grads) and all(torch.isfinite(g).all() for g in grads)
    return got[real].detach(), want[real], finite


@pytest.mark.parametrize("name, optimized", [
    pytest.param("bert-base", False, id="bert-base-plain"),
    pytest.param("bert-base", True, id="bert-base-optimized", marks=pytest.mark.slow),
    pytest.param("gpt2", False, id="gpt2-plain", marks=pytest.mark.slow),
    pytest.param("gpt2", True, id="gpt2-optimized")])
def test_compiled_model_matches_eager(name, optimized):
    got, want, _ = _compare(name, "aot_eager", optimized)
    assert torch.allclose(got, want, atol=1e-4, rtol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("optimized", [False, True], ids=["plain", "optimized"])
@pytest.mark.parametrize("name", FAMILIES)
def test_every_family_compiles_and_matches_eager(name, optimized):
    got, want, finite = _compare(name, "aot_eager", optimized, backward=True)
    assert torch.allclose(got, want, atol=1e-4, rtol=1e-4) and finite


@pytest.mark.slow
@pytest.mark.parametrize("name", ["bert-base", "gpt2", "t5-small"])
def test_inductor_compiles_each_architecture_and_matches_eager(name):
    got, want, _ = _compare(name, "inductor", optimized=True)
    assert torch.allclose(got, want, atol=1e-4, rtol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["bert-base", "gpt2"])
def test_inductor_compiles_optimized_inference_under_no_grad(name):
    """Eager fp32 CPU inference runs oneDNN's linear; a compiled graph keeps F.linear (Inductor lowers
    that op only for frozen weights: it once failed here with a LoweringException)."""
    got, want, _ = _compare(name, "inductor", optimized=True, inference=True)
    assert torch.allclose(got, want, atol=1e-4, rtol=1e-4)


@pytest.mark.slow
def test_a_compiled_model_does_not_recompile_per_batch_shape():
    """Once the batch and the length have each changed, Dynamo holds them dynamic: seven shapes, three graphs
    (a batch of one would be its own: Dynamo specialises sizes 0 and 1)."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()  # the counts of earlier tests in this process
    model = _model("bert-base")
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    with torch.no_grad():
        for batch, length in ((2, 11), (2, 13), (3, 17), (4, 9), (5, 30), (7, 7), (6, 12)):
            ids = torch.randint(3, model.config.vocab_size, (batch, length))
            mask = torch.ones_like(ids)
            mask[0, length - 2:] = 0
            torch.testing.assert_close(compiled(ids, mask).logits[mask.bool()],
                                       model(ids, mask).logits[mask.bool()], atol=1e-4, rtol=1e-4)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] <= 3


@pytest.mark.slow
@pytest.mark.parametrize("name", ["longformer-base", "bigbird-base"])
def test_long_inputs_that_eager_runs_blocked_compile_in_one_graph_with_dense_masks(name):
    """Blocked attention's chunk plans follow the data: a compiled graph runs the dense masks instead."""
    torch._dynamo.reset()
    model = _model(name)
    lmforge.optimize(model, paths=FastPaths(local_attention="blocked"))
    T = 64
    ids = torch.randint(3, model.config.vocab_size, (2, T), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, T - 5:] = 0
    with torch.no_grad():
        want = model(ids, mask).logits
        got = torch.compile(model, backend="aot_eager", fullgraph=True)(ids, mask).logits
    torch.testing.assert_close(got[mask.bool()], want[mask.bool()], atol=1e-4, rtol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("optimized", [False, True], ids=["plain", "optimized"])
def test_elmo_compiles_and_matches_eager(optimized):
    """ELMo's biLSTM, plain and optimized: the compiled model's states at the real words are eager's."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    cfg = lmforge.tiny("elmo-small")
    model = lmforge.build(cfg).eval()
    if optimized:
        lmforge.optimize(model)
    chars = torch.randint(1, cfg.n_characters, (2, 7, cfg.max_characters_per_token),
                          generator=torch.Generator().manual_seed(0))
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[1, 5:] = 0
    with torch.no_grad():
        want = model(chars, mask).last_hidden_state
        got = torch.compile(model, backend="aot_eager")(chars, mask).last_hidden_state
    torch.testing.assert_close(got[mask.bool()], want[mask.bool()], atol=1e-4, rtol=1e-4)
