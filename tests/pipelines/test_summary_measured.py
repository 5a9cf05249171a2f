"""flops_per_token held to what a forward measurably multiplies (FlopCounterMode) where a layer's pattern
lets every query see its keys, and its pattern keys to layers/patterns.py's masks."""
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import lmforge
from lmforge.heads import make_head
from lmforge.layers.patterns import pattern_mask
from lmforge.model import from_config
from lmforge.pipelines.summary import _attended_keys, config_parameter_counts, flops_per_token


@pytest.mark.parametrize("preset,fields,T", [
    ("xlnet-base", {}, 16),  # W_r over the 2T - 1 distances, each query against them: 31 % under
    ("linformer-base", {}, 32),  # E and F (k x T) on keys and values: 8 % under
    ("linformer-base", {}, 8),  # shorter than k: still k projected keys (T were charged)
    ("linformer-base", {"pruned_heads": {"encoder.0": [0, 2]}}, 32),  # a pruned head's share of E, F
    ("longformer-base", {}, 5),  # T <= w / 2 + 1: all visible; global q, k, v of every token + G rows
    ("longformer-base", {"pruned_heads": {"encoder.1": [1]}}, 5),
    ("longformer-base", {"n_global_tokens": 0}, 5),  # no global token: its q, k, v are not computed
    ("bigbird-base", {"dense_max_len": 48}, 48)])  # at most dense_max_len tokens attend fully (32 charged)
def test_flops_per_token_are_what_a_forward_multiplies(preset, fields, T):
    """T tokens through the model and its LM head: FlopCounterMode's matmul FLOPs are T x flops_per_token."""
    cfg = lmforge.tiny(preset).replace(**fields)
    model = from_config(cfg)  # training mode: CPU inference's fused attention kernel is not counted by torch
    head, ids = make_head(model, "lm"), torch.randint(5, cfg.vocab_size, (1, T))
    with FlopCounterMode(display=False) as counted:
        head(model(ids, run_heads=False).last_hidden_state)
    assert counted.get_total_flops() == T * flops_per_token(cfg, T)


@pytest.mark.parametrize("preset,fields", [
    ("mistral-7b", {}),  # causal: the w keys i - w < j <= i (w + 1 were charged)
    ("bert-base", {"attention": "sliding-window", "window": 7}),  # |i - j| <= 3: 7 keys (8 were charged)
    ("bert-base", {"attention": "dilated", "window": 7, "dilation": 2}),
    ("gpt2", {"attention": "dilated", "dilation": 2}),
    ("longformer-base", {"window": 7})])
def test_attended_keys_are_what_the_pattern_mask_shows_a_query_away_from_the_edges(preset, fields):
    """The keys a query at the sequence's end (causal) or middle (bidirectional) sees in the mask."""
    cfg, T = lmforge.tiny(preset, **fields), 64
    causal, pos = cfg.architecture == "decoder", torch.arange(T)
    glob = torch.zeros(1, T, dtype=torch.bool)
    glob[:, :cfg.n_global_tokens] = True
    mask = pattern_mask(cfg, cfg.attention, pos, pos, causal, glob, 0)
    row = T - 1 if causal else T // 2
    assert int(mask[0, 0, row].sum()) == _attended_keys(cfg, cfg.attention, T, cfg.window)


@pytest.mark.parametrize("preset,T", [("gpt2", 32), ("bert-base", 32), ("bert-base", 31), ("gpt2", 8)])
def test_dilated_keys_at_a_context_shorter_than_the_dilated_band_are_every_d_th(preset, T):
    """Window 16, dilation 4 spans 61 positions: at T = 32 the last (middle) query sees 8 keys, 16 (17)
    were charged, twice the scores and mixing the mask lets it compute."""
    cfg, pos = lmforge.tiny(preset, attention="dilated", window=16, dilation=4), torch.arange(T)
    causal = cfg.architecture == "decoder"
    mask = pattern_mask(cfg, "dilated", pos, pos, causal, None, 0)
    row = T - 1 if causal else T // 2
    assert int(mask[0, 0, row].sum()) == _attended_keys(cfg, "dilated", T, cfg.window)


@pytest.mark.parametrize("fields,T", [({}, 64), ({}, 30), ({"n_random_blocks": 1}, 64),
                                      ({"random_block_choice": "first"}, 64)])
def test_bigbird_keys_are_its_mask_s_visible_pairs_shared_over_the_context(fields, T):
    """The first and last blocks see every key (11 % more keys a token at T = 64, 21 % at bigbird-base's
    4096 were not charged); a short last block and too few blocks to draw r from as the mask has them."""
    cfg, pos = lmforge.tiny("bigbird-base", **fields), torch.arange(T)
    pairs = int(pattern_mask(cfg, "bigbird", pos, pos, False, None, 1).sum())
    assert T * _attended_keys(cfg, "bigbird", T, cfg.window) == pairs


def test_a_pruned_mixed_longformer_schedule_counts_as_its_built_model():
    """A full layer beside Longformer layers with global projections: its one-layer sample had kept
    global_projections and was refused (a ConfigError naming it) before anything was counted."""
    cfg = lmforge.tiny("longformer-base", n_layers=3, attention_schedule=["longformer", "full", "longformer"])
    cfg = cfg.replace(pruned_heads={"encoder.1": [1], "encoder.2": [0, 3]})
    assert config_parameter_counts(cfg)["total"] == from_config(cfg).num_parameters()
