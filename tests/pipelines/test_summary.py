import pytest
import torch

import lmforge
from lmforge.model import from_config
from lmforge.pipelines.summary import config_parameter_counts, describe, flops_per_token, parameter_counts

from tests.conftest import ALL_PRESETS


def test_gpt2_flops_follow_kaplan_and_palm():
    cfg = lmforge.get_config("gpt2")
    with torch.device("meta"):
        model = from_config(cfg, init=False)
    counts = parameter_counts(model)
    # Kaplan et al. 2020: C_forward ~ 2 N + 2 n_layer n_ctx d_attn (+ the output projection);
    # PaLM (App. B) also counts the weighted sum of values: 2 N + 4 n_layer n_ctx d_attn
    palm = 2 * counts["non_embedding"] + 4 * 12 * 1024 * 768 + 2 * 768 * 50257
    assert abs(flops_per_token(cfg, 1024) - palm) / palm < 0.01
    assert counts["total"] == counts["embeddings"] + counts["non_embedding"]


def test_albert_sharing_costs_compute_not_parameters():
    shared = lmforge.get_config("albert-base")
    unshared = shared.replace(share_layers=False)
    assert flops_per_token(shared) == flops_per_token(unshared)


def test_sparse_patterns_cost_less_at_long_context():
    cfg = lmforge.get_config("longformer-base")
    assert flops_per_token(cfg, 4096) < flops_per_token(cfg.replace(attention="full",
                                                                    global_projections=False), 4096)


def test_a_window_schedule_sets_each_layer_s_keys_in_the_flops_not_window():
    """The estimate read `window` (8 here) for every layer, which no layer reads under a schedule."""
    cfg = lmforge.tiny("mistral-7b", n_kv_heads=None, window_schedule=[4, 16])
    each = [cfg.replace(window_schedule=None, window=w) for w in (4, 16)]
    assert 2 * flops_per_token(cfg, 64) == flops_per_token(each[0], 64) + flops_per_token(each[1], 64)
    q_dim = cfg.n_heads * cfg.head_dim  # 2 FLOPs per multiply-add, for the scores and the mixing
    assert flops_per_token(cfg, 64) - flops_per_token(each[0], 64) == 2 * 2 * (16 - 4) * q_dim
    pruned = cfg.replace(pruned_heads={"decoder.1": [0]})  # a head of the causal window-16 layer: 16 keys
    d, dh = cfg.d_model, cfg.head_dim
    assert flops_per_token(cfg, 64) - flops_per_token(pruned, 64) == 2 * (4 * d * dh + 2 * 16 * dh)


def test_describe_names_the_parts():
    text = describe(lmforge.build(lmforge.tiny("llama-3.2-1b")))
    assert "rotary" in text and "swiglu" in text and "GQA" in text and "FLOPs/token" in text


def _deeper(cfg, layers=3):
    """`cfg` (a tiny preset) with `layers` layers, its schedules stretched to match."""
    changes = {"n_layers": layers}
    for name in ("attention_schedule", "window_schedule"):
        if getattr(cfg, name):
            changes[name] = (getattr(cfg, name) * layers)[:layers]
    if cfg.architecture == "encoder-decoder":
        changes["n_decoder_layers"] = layers + 1
    return cfg.replace(**changes)


MIXED = [
    dict(architecture="encoder", n_layers=4, window=8, global_projections=True,
         attention_schedule=["sliding-window", "full", "longformer", "full"]),
    dict(architecture="decoder", n_layers=3, attention="sliding-window", window_schedule=[4, 8, 16]),
    dict(architecture="encoder", n_layers=5, share_layers=True, d_embed=16),
    dict(architecture="encoder", n_layers=3, attention="linformer", linformer_k=16),
    dict(architecture="encoder-decoder", n_layers=2, n_decoder_layers=5, position="relative-bias"),
]


@pytest.mark.parametrize("name", [p for p in ALL_PRESETS if not p.endswith("generator")])
def test_config_counts_equal_the_built_models(name):
    cfg = _deeper(lmforge.tiny(name))
    with torch.device("meta"):
        model = from_config(cfg, init=False)
    assert config_parameter_counts(cfg) == parameter_counts(model)


@pytest.mark.parametrize("fields", MIXED, ids=lambda f: f.get("attention", "") + str(f["n_layers"]))
def test_config_counts_follow_schedules_sharing_and_decoders(fields):
    tiny = dict(vocab_size=99, d_model=32, n_heads=4, d_ff=64, max_seq_len=64)
    cfg = lmforge.ModelConfig(**{**tiny, **fields})
    with torch.device("meta"):
        model = from_config(cfg, init=False)
    assert parameter_counts(cfg) == parameter_counts(model)


def test_the_largest_config_allowed_is_counted_not_built():
    cfg = lmforge.get_config("bert-tiny", n_layers=1024, d_model=65536)  # 17.6 T parameters
    d, ff = 65536, 512
    per_layer = (4 * d * d + 4 * d) + (2 * d * ff + ff + d) + 4 * d  # attention, feed-forward, two norms
    counts = parameter_counts(cfg)
    assert counts["non_embedding"] == 1024 * per_layer + 2 * d + 2 * d  # + segments, embedding norm
    assert counts["embeddings"] == (30522 + 512) * d and "1024" in describe(cfg)


def test_a_context_must_be_positive():
    for bad in (0, -5):
        with pytest.raises(ValueError, match="context"):
            flops_per_token(lmforge.get_config("gpt2"), bad)


@pytest.mark.parametrize("preset, context, words", [
    ("gpt2", 0, "at least 1 token"), ("gpt2", 2.5, "at least 1"), ("gpt2", 1025, "exceeds max_seq_len=1024"),
    ("elmo-small", 5, "do not depend on the context")])
def test_describe_refuses_a_context_as_lmforge_inspect_does(preset, context, words, capsys):
    """Python's describe and `lmforge inspect --context` refuse alike, naming the context (an ELMo's
    was ignored in Python)."""
    from lmforge.cli import main
    from lmforge.config.options import OptionsError

    with pytest.raises(OptionsError, match=words) as refused:
        describe(lmforge.get_config(preset), context)
    assert refused.value.field == "context"
    if isinstance(context, int):
        assert main(["inspect", preset, "--context", str(context)]) == 2
        assert words in capsys.readouterr().err


PRUNED = {  # tiny presets of each family with heads (where the positions allow) and FFN units removed
    "bert-tiny": dict(pruned_heads={"encoder.0": [1, 3], "encoder.2": [0]}, ffn_sizes={"encoder.1": 20}),
    "gpt2": dict(pruned_heads={"decoder.1": [2]}, ffn_sizes={"decoder.0": 7, "decoder.2": 64}),
    "llama-3.2-1b": dict(n_kv_heads=None, pruned_heads={"decoder.2": [0, 1, 2]}, ffn_sizes={"decoder.1": 9}),
    "t5-small": dict(ffn_sizes={"encoder.0": 5, "decoder.3": 30}),  # per-head relative bias: no head pruning
    "bart-base": dict(pruned_heads={"encoder.1": [1], "decoder.0": [0], "cross.3": [0, 2]},
                      ffn_sizes={"decoder.2": 11}),
}


@pytest.mark.parametrize("name", list(PRUNED))
def test_pruned_configs_are_counted_as_built(name):
    cfg = _deeper(lmforge.tiny(name), layers=3).replace(**PRUNED[name])
    with torch.device("meta"):
        model = from_config(cfg, init=False)
    assert config_parameter_counts(cfg) == parameter_counts(model)


def test_describe_reports_what_pruning_left():
    cfg = _deeper(lmforge.tiny("bart-base"), layers=3).replace(**PRUNED["bart-base"])  # 3 + 4 layers, 4 heads
    line = next(row for row in describe(cfg).splitlines() if row.startswith("pruned"))
    assert "heads: 4 of 44 removed (in 3 attentions)" in line  # (3 + 2 x 4) attentions x 4 heads
    assert "feed-forward: 395 of 448 units kept (1 layer pruned to 11 units)" in line  # 7 layers x 64
    assert not any(row.startswith("pruned") for row in describe(lmforge.tiny("bart-base")).splitlines())


def test_an_elmo_config_is_described_as_a_bilstm_with_the_flops_its_forward_counts():
    from torch.utils.flop_counter import FlopCounterMode

    from lmforge.pipelines.summary import describe, elmo_flops

    cfg = lmforge.get_config("elmo-small", vocab_size=100, lstm_dim=64, d_model=32,
                             char_filters=[[1, 8], [2, 16]])
    model, T = lmforge.from_config(cfg).eval(), 5
    with FlopCounterMode(display=False) as counted, torch.no_grad():  # convolutions and products
        model(torch.randint(1, 200, (1, T, cfg.max_characters_per_token)))
    assert counted.get_total_flops() == T * elmo_flops(cfg)
    text = describe(lmforge.get_config("elmo-small"))
    assert "biLSTM layers, each direction 1024 cells projected to d_model=128" in text
    assert not any(word in text for word in ("heads", "attention", "feed-forward", "d_ff"))  # a Transformer's


@pytest.mark.parametrize("preset,fields", [
    ("bert-base", {"tie_embeddings": False, "lm_transform": False}),  # d_model -> V: E had been charged
    ("bert-base", {"tie_embeddings": False}), ("bert-base", {}),  # the transform d -> E, then E -> V
    ("gpt2", {"tie_embeddings": False}), ("t5-small", {"tie_embeddings": False}),
    ("t5-small", {"lm_transform": True})])  # an encoder-decoder: each stack projects its tokens E -> d
def test_flops_per_token_are_what_a_forward_with_its_lm_head_costs(preset, fields):
    """T tokens through the model (an encoder-decoder: T in, T out) and the LM head on each, E = 16 !=
    d_model: FlopCounterMode's matmul FLOPs are T x flops_per_token exactly, tied or untied."""
    from torch.utils.flop_counter import FlopCounterMode

    from lmforge.heads import make_head

    cfg, T = lmforge.tiny(preset).replace(d_embed=16, **fields), 12
    model = from_config(cfg)  # training mode: CPU inference's fused attention kernel is not counted by torch
    head, ids = make_head(model, "lm"), torch.randint(5, cfg.vocab_size, (1, T))
    seq2seq = {"decoder_input_ids": ids} if cfg.architecture == "encoder-decoder" else {}
    with FlopCounterMode(display=False) as counted:
        head(model(ids, **seq2seq, run_heads=False).last_hidden_state)
    assert counted.get_total_flops() == T * flops_per_token(cfg, T)
