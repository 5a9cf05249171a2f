"""FLOP accounting: the per-objective count against the analytic per-layer matmul count, and
schedules that meet the budget within 2 %."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from lmforge import objectives
from lmforge.bakeoff.flops import BACKWARD_FACTOR, forward_flops, schedule
from lmforge.presets import get_config

V, T, RATE = 1000, 64, 0.15


def encoder_macs_per_token(d, d_ff, n_layers, E, T):
    """Multiply-adds per token of a BERT encoder, written out (Kaplan et al. 2020, Table 1):
    per layer Q, K, V and output projections 4 d^2, the feed-forward 2 d d_ff, the attention
    scores QK^T and the weighted sum of values 2 T d; plus the E -> d embedding projection."""
    per_layer = 4 * d * d + 2 * d * d_ff + 2 * T * d
    return n_layers * per_layer + (E * d if E != d else 0)


def lm_head_macs(d, E, V):
    """BERT's MLM head per predicted token: the transform d -> E, then the tied projection E -> V."""
    return d * E + E * V


def test_bert_mlm_matches_the_analytic_count():
    cfg = get_config("bert-base", vocab_size=V)  # d 768, d_ff 3072, 12 layers, E = d
    d, d_ff, L = 768, 3072, 12
    expected = 2 * T * (encoder_macs_per_token(d, d_ff, L, d, T) + RATE * lm_head_macs(d, d, V))
    got = forward_flops(objectives.get("mlm"), cfg, T)
    assert sum(got.values()) == pytest.approx(expected, rel=1e-9)
    # the 6 N rule of thumb (Kaplan): training FLOPs per token ~ 6 x non-embedding parameters, here
    # 12 layers x 12 d^2; the context term 2 T d per layer is small at T = 64
    sixn = 6 * L * 12 * d * d
    assert BACKWARD_FACTOR * got["encoder"] / T == pytest.approx(sixn, rel=0.05)


def test_electra_is_charged_for_generator_and_discriminator():
    cfg = get_config("electra-small", vocab_size=V)  # d 256, d_ff 1024, 12 layers, E 128
    d, d_ff, L, E = 256, 1024, 12, 128
    g, g_ff = 64, 256  # generator x 1/4: d_model, d_ff (and heads) scaled, same depth and E
    disc = encoder_macs_per_token(d, d_ff, L, E, T) + (d * d + d)  # + RTD head: dense d -> d, score d -> 1
    gen = encoder_macs_per_token(g, g_ff, L, E, T) + RATE * lm_head_macs(g, E, V)
    got = forward_flops(objectives.get("rtd"), cfg, T, {"ratio": 0.25})
    assert sum(got.values()) == pytest.approx(2 * T * (disc + gen), rel=1e-9)
    assert got["generator"] < got["discriminator"]
    mlm = sum(forward_flops(objectives.get("mlm"), cfg, T).values())
    assert sum(got.values()) > mlm  # the same discriminator trained by MLM is cheaper per step


def test_encoder_decoders_charge_encoder_and_decoder():
    cfg = get_config("t5-small", vocab_size=V)
    t5 = forward_flops(objectives.get("span-corruption"), cfg, T)
    assert set(t5) == {"encoder", "decoder", "lm_head"} and t5["decoder"] > 0
    half = forward_flops(objectives.get("span-corruption"), cfg, T, {"noise_density": 0.5})
    assert half["decoder"] > t5["decoder"]  # longer targets; T5's blocks make either input fill T
    assert half["encoder"] == pytest.approx(t5["encoder"], rel=0.01)


def test_span_corruption_matches_the_analytic_count_of_its_short_targets():
    """T5's decoder reads n_out = 15 targets of a 64-token input: its self-attention sees 15 keys, its
    cross-attention 64, and cross-attention's k, v are projected once per input token (as T5 runs it)."""
    cfg = get_config("t5-small", vocab_size=V)  # d 512, d_ff 2048, 6 + 6 layers, relu, tied, no transform
    d, d_ff, L, n_in, n_out = 512, 2048, 6, 64, 15
    encoder = L * (4 * d * d + 2 * d * d_ff + 2 * n_in * d)
    decoder = L * (4 * d * d + 2 * n_out * d + 2 * d * d + 2 * n_in * d + 2 * d * d_ff) + d * V
    cross_kv = L * 2 * d * d  # per input token
    got = forward_flops(objectives.get("span-corruption"), cfg, T)
    assert got["encoder"] == pytest.approx(2 * n_in * encoder, rel=1e-9)
    assert got["decoder"] + got["lm_head"] == pytest.approx(2 * (n_out * decoder + n_in * cross_kv), rel=1e-9)
    # where inputs and targets are one length (BART), the decoder is charged as flops_per_token counts it
    from lmforge.pipelines.summary import flops_per_token

    bart = get_config("bart-base", vocab_size=V)
    whole = forward_flops(objectives.get("denoising"), bart, T)
    encoder_only = bart.replace(architecture="encoder", n_decoder_layers=None)
    encoder = flops_per_token(encoder_only, T, lm_head=False)
    assert whole["decoder"] + whole["lm_head"] == pytest.approx(T * (flops_per_token(bart, T) - encoder))


def test_structbert_is_charged_for_its_word_and_sentence_order_heads():
    """StructBERT runs the MLM head again on the shuffled trigrams (wso_rate = 5 % of the unmasked
    tokens) and a pooler + 3-way classifier on [CLS] once an example, beyond BERT's masked LM."""
    cfg = get_config("bert-base", vocab_size=V)
    d, d_ff, L = 768, 3072, 12
    shuffled = 0.05 * (1 - RATE) * T
    head = (RATE * T + shuffled) * lm_head_macs(d, d, V)
    expected = 2 * (T * encoder_macs_per_token(d, d_ff, L, d, T) + head + d * d + 3 * d)
    got = forward_flops(objectives.get("structural"), cfg, T)
    assert sum(got.values()) == pytest.approx(expected, rel=1e-9)
    bare = forward_flops(objectives.get("structural"), cfg, T, {"wso_rate": 0.0, "sso": False})
    assert sum(bare.values()) == pytest.approx(sum(forward_flops(objectives.get("mlm"), cfg, T).values()))


@pytest.mark.parametrize("name", ["mlm", "rtd", "nsp", "span", "wwm"])
def test_schedules_meet_the_budget_within_two_percent(name):
    cfg = get_config("electra-small", vocab_size=V, n_layers=2)
    for budget in (1e12, 3.3e12, 1e13):
        s = schedule(objectives.get(name), cfg, T, 16, budget)
        assert abs(s.flops - budget) / budget <= 0.02
        assert s.flops == pytest.approx(s.steps * s.flops_per_step)


def test_electra_ablations_are_charged_for_the_generator_and_their_heads():
    cfg = get_config("electra-small", vocab_size=V)
    rtd = forward_flops(objectives.get("rtd"), cfg, T, {"ratio": 0.25})
    replace = forward_flops(objectives.get("replace-mlm"), cfg, T, {"ratio": 0.25})
    every = forward_flops(objectives.get("all-tokens-mlm"), cfg, T, {"ratio": 0.25})
    for charges in (replace, every):
        assert charges["generator"] == rtd["generator"] and charges["discriminator"] == rtd["discriminator"]
    d, E = 256, 128
    assert replace["lm_head"] == pytest.approx(2 * RATE * T * lm_head_macs(d, E, V))
    assert every["lm_head"] == pytest.approx(2 * T * lm_head_macs(d, E, V)) and \
        every["copy_gate"] == 2 * T * d


def test_span_masking_without_sbo_is_not_charged_for_it():
    cfg = get_config("bert-mini", vocab_size=V)
    with_sbo = forward_flops(objectives.get("span"), cfg, T)
    without = forward_flops(objectives.get("span-mlm"), cfg, T)
    assert "sbo" in with_sbo and "sbo" not in without
    assert without == forward_flops(objectives.get("wwm"), cfg, T)  # the masked LM alone, as whole-word's


def test_whole_text_targets_cost_a_full_decoder_pass():
    cfg = get_config("t5-small", vocab_size=V)
    span = forward_flops(objectives.get("span-corruption"), cfg, T)
    for name in ("t5-bert-style", "t5-deshuffling"):
        whole = forward_flops(objectives.get(name), cfg, T)
        # both encoders read T tokens (span corruption's blocks are sized so), the decoders differ
        assert whole["encoder"] == pytest.approx(span["encoder"], rel=0.01)
        assert whole["decoder"] > 3 * span["decoder"]


@pytest.mark.parametrize("name", ["mlm", "span", "span-mlm", "rtd", "replace-mlm", "distillation"])
def test_the_count_reads_the_masking_the_objective_is_built_with(name):
    """Every masked LM's count reads its rate from what builds it (MaskedLM's default, passed on through
    **mlm), not from a default of its own; ELECTRA's generator keeps ELECTRA's replacement mix."""
    import lmforge
    from lmforge.bakeoff.flops import objective_options

    spec = objectives.get(name)
    options = objective_options(spec, {})
    if spec.teacher:  # distillation: the student objective is a MaskedLM too, built around a teacher
        assert options["rate"] == RATE
        return
    electra = "rtd" in name or "replace" in name
    model = lmforge.build(lmforge.tiny("electra-small" if electra else "bert-base"))
    built = spec.build.__self__(model, 4, **{k: v for k, v in options.items() if k in ("rate", "replace")})
    masked = getattr(built, "generator", built)
    assert (masked.rate, masked.replace) == (options["rate"], options["replace"]) == (
        RATE, (0.85, 0.0, 0.15) if masked is not built else (0.8, 0.1, 0.1))
    cfg = get_config("bert-mini", vocab_size=V)
    more = forward_flops(spec, cfg, T, {"rate": 0.3})  # twice the positions predicted
    assert sum(more.values()) > sum(forward_flops(spec, cfg, T).values())


@pytest.mark.parametrize("T,options", [(32, {}), (64, {"final_sentinel": False}), (512, {}),
                                       (64, {"noise_density": 0.5, "mean_noise_span_length": 2.0})])
def test_span_corruption_is_counted_at_the_lengths_the_objective_writes(T, options):
    """The encoder and decoder are charged for the input and target lengths span corruption builds from
    a block of block_length raw tokens: T5's rounded noise and span counts, the final sentinel and </s>
    (at T = 32 the target is 9 tokens, not 7.8: the decoder had been charged 15 % short)."""
    import torch

    from lmforge.bakeoff.flops import objective_options, seq2seq_lengths
    from lmforge.objectives.t5_span_corruption import (SpanCorruption, block_length, corrupt_spans,
                                                       random_spans_noise_mask)

    opts = objective_options(objectives.get("span-corruption"), options)
    n = block_length(T, opts)
    mask = random_spans_noise_mask(n, torch.Generator().manual_seed(0), opts["noise_density"],
                                   opts["mean_noise_span_length"])
    inputs, targets = corrupt_spans(list(range(1000, 1000 + n)), mask, list(range(100)), 1,
                                    opts["final_sentinel"])
    assert seq2seq_lengths(SpanCorruption, opts, T) == (len(inputs), len(targets))


def test_a_decoders_prefix_lm_is_charged_for_the_vocabulary_on_its_continuation_only():
    """PrefixLM projects to the vocabulary only where a continuation token is predicted (T - P positions,
    T / 2 on average); charged at every position, its arm had bought ~30 % fewer steps than its budget."""
    from lmforge.bakeoff.flops import head_flops
    from lmforge.objectives.prefix_lm import PrefixLM

    cfg = get_config("gpt2", vocab_size=V, n_layers=2)
    predicted = [sum(label != -100 for label in PrefixLM.corrupt(None, {"input_ids": list(range(T))},
                                                                  _at(P))["labels"]) for P in range(1, T)]
    got = forward_flops(objectives.get("prefix-lm"), cfg, T)
    assert got["lm_head"] == pytest.approx(sum(predicted) / len(predicted) * head_flops(cfg, T))
    # a causal LM predicts the T - 1 tokens that follow another (the last has no target)
    clm = forward_flops(objectives.get("clm"), cfg, T)
    assert clm["lm_head"] == pytest.approx((T - 1) * head_flops(cfg, T))


def _at(P):
    """A generator whose split_point draw is P (torch.randint's draw found by trying seeds)."""
    import torch

    from lmforge.objectives.prefix_lm import split_point

    return next(torch.Generator().manual_seed(s) for s in range(10_000)
                if split_point(T, torch.Generator().manual_seed(s)) == P)


@pytest.mark.parametrize("micro_batch", [1, 2, 3])
def test_an_encoder_decoders_prefix_lm_is_charged_for_its_padded_micro_batches(micro_batch):
    """Each side (prefix + </s>, continuation + </s>) is padded to the longest of its micro-batch: the
    count is the exact expectation over every split of the micro-batch (at 8 examples a micro-batch
    near T a side: charged T / 2 a side, the arm had spent ~1.9 x its budget)."""
    import itertools

    from lmforge.bakeoff.flops import seq2seq_lengths

    n = 7
    splits = list(itertools.product(range(1, n), repeat=micro_batch))
    prefix = sum(max(s) + 1 for s in splits) / len(splits)
    continuation = sum(max(n - p for p in s) + 1 for s in splits) / len(splits)
    assert seq2seq_lengths(None, {}, n, micro_batch) == pytest.approx((prefix, continuation))
    cfg = get_config("t5-small", vocab_size=V)
    wide = forward_flops(objectives.get("prefix-lm"), cfg, T, micro_batch=16)
    assert sum(wide.values()) > 1.5 * sum(forward_flops(objectives.get("prefix-lm"), cfg, T).values())


def test_shares_charge_each_part_on_the_positions_it_runs_on():
    """A masked LM's heads run on `rate` of the maskable tokens, its networks on the padded length;
    All-Tokens MLM's head on the non-padding tokens; no Shares: every position, the upper bound."""
    from lmforge.bakeoff.flops import Shares
    from lmforge.pipelines.summary import flops_per_token

    cfg = get_config("bert-mini", vocab_size=V)
    bound = forward_flops(objectives.get("span"), cfg, T)
    assert forward_flops(objectives.get("span"), cfg, T, shares=Shares()) == bound
    half = forward_flops(objectives.get("span"), cfg, T, shares=Shares(maskable=0.5))
    assert half["encoder"] == bound["encoder"]
    for head in ("lm_head", "sbo"):
        assert half[head] == pytest.approx(bound[head] / 2)
    short = forward_flops(objectives.get("mlm"), cfg, T, shares=Shares(padded=0.5))
    assert short["encoder"] == pytest.approx(T / 2 * flops_per_token(cfg, T // 2, lm_head=False))
    electra = get_config("electra-small", vocab_size=V)
    every = forward_flops(objectives.get("all-tokens-mlm"), electra, T,
                          shares=Shares(tokens=0.75, maskable=0.5))
    upper = forward_flops(objectives.get("all-tokens-mlm"), electra, T)
    assert every["lm_head"] == pytest.approx(0.75 * upper["lm_head"])
    assert every["generator_lm_head"] == pytest.approx(0.5 * upper["generator_lm_head"])


@pytest.mark.parametrize("shares", [{"padded": 0.0}, {"maskable": 1.5}, {"tokens": float("nan")},
                                    {"squared": 0.0}])
def test_shares_out_of_range_are_refused(shares):
    from lmforge.bakeoff.flops import Shares

    with pytest.raises(ValueError, match=f"Shares.{next(iter(shares))}"):
        Shares(**shares)


@pytest.mark.parametrize("micro_batch", [1, 8, 32])
def test_an_encoder_decoders_vocabulary_projection_runs_on_its_real_targets_only(micro_batch):
    """teacher_forced_loss projects the target's real tokens, not its padding: a prefix LM's continuation
    + </s> (T / 2 + 1 on average) whatever its micro-batch is padded to (charged there, the t5 plan's
    prefix-LM arm had been charged 19 % over at batch 32, 11 % in t5-gpu); the decoder runs on the padding."""
    from lmforge.bakeoff.flops import head_flops, seq2seq_lengths
    from lmforge.objectives.prefix_lm import EncoderDecoderPrefixLM

    cfg = get_config("t5-small", vocab_size=V)
    targets = [len(EncoderDecoderPrefixLM.corrupt(SimpleNamespace(eos_id=1), {"input_ids": list(range(T))},
                                                  _at(P))["labels"]) for P in range(1, T)]
    got = forward_flops(objectives.get("prefix-lm"), cfg, T, micro_batch=micro_batch)
    assert got["lm_head"] == pytest.approx(sum(targets) / len(targets) * head_flops(cfg, T))
    padded = seq2seq_lengths(None, {}, T, micro_batch)[1]
    assert padded >= sum(targets) / len(targets)  # the decoder's length, not the projection's


def test_a_denoiser_is_charged_at_its_examples_shares():
    """BART's examples are a document's sentences, often short of T: the decoder runs on the padded length
    (Shares.padded), the encoder unpadded and the vocabulary projection on the real tokens (Shares.tokens)."""
    from lmforge.bakeoff.flops import Shares, packed_body, reads_shares
    from lmforge.pipelines.summary import flops_per_token

    cfg, spec = get_config("bart-base", vocab_size=V), objectives.get("denoising")
    assert reads_shares(spec) and reads_shares(objectives.get("t5-bert-style"))
    full = forward_flops(spec, cfg, T)
    short = forward_flops(spec, cfg, T, shares=Shares(padded=0.5, tokens=0.25))
    assert short["lm_head"] == pytest.approx(full["lm_head"] / 4)
    encoder_only = cfg.replace(architecture="encoder", n_decoder_layers=None)
    # the encoder unpadded (the trainer packs its input): its layers on the T / 4 real tokens
    assert short["encoder"] == pytest.approx(packed_body(encoder_only, T / 4, T / 2, (T / 2) ** 2))
    assert short["encoder"] < 0.6 * T / 2 * flops_per_token(encoder_only, T // 2, lm_head=False)


@pytest.mark.parametrize("preset,overrides", [("bert-mini", {}), ("bert-mini", {"attention_dropout": 0.0}),
                                              ("electra-small", {}), ("t5-small", {})])
def test_an_unpadded_pass_without_padding_is_a_padded_one(preset, overrides):
    """Where no position is padding, packing changes nothing: the count is the padded one, T x FLOPs per
    token, whichever way the attention runs (per_sequence, or re-padded: dropout, T5's position bias)."""
    from lmforge.bakeoff.flops import packed_body, per_sequence
    from lmforge.pipelines.summary import flops_per_token

    cfg = get_config(preset, vocab_size=V, **overrides).replace(architecture="encoder", n_decoder_layers=None)
    assert per_sequence(cfg) == (preset == "bert-mini" and overrides == {"attention_dropout": 0.0})
    body = T * flops_per_token(cfg, T, lm_head=False)
    assert packed_body(cfg, T, T, T * T) == pytest.approx(body, rel=1e-12)
    assert packed_body(cfg, T / 2, T, T * T / 4) < body
