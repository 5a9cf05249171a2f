"""Training FLOPs per step of every objective, counted from lmforge's own forward count.

A training step costs 3 x the forward FLOPs of every network the objective runs (the backward
pass is about twice the forward: Kaplan et al. 2020, sec. 2.1), per example, x examples per step.
The forward count is pipelines.summary.flops_per_token (2 FLOPs per multiply-add of every matmul).
What each objective runs, per example of T = max_len tokens:

- masked LM (BERT, RoBERTa, whole-word, NSP/SOP, SpanBERT): the encoder unpadded (below); the
  vocabulary projection only on the positions selected, `rate` of the maskable tokens (MaskedLM
  computes it nowhere else); NSP/SOP's pooler + classifier once; SpanBERT's SBO on the selected
  positions; StructBERT's word-order task the vocabulary projection again on the shuffled `wso_rate`
  share of the maskable tokens left unmasked, and its sentence-order task a pooler + 3-way classifier once;
- replaced-token detection (ELECTRA): the generator (its own config, generator_config) unpadded with
  its LM head on the selected positions, plus the discriminator unpadded with its RTD head (dense
  d -> d, score d -> 1) on each padded position — ELECTRA is charged for both networks; its MLM ablations
  the same generator, and the model's LM head on the selected positions (Replace MLM) or on every
  non-padding token with the copy gate (All-Tokens MLM);
- encoder-decoders (T5 span corruption and denoisers, prefix LM, BART denoising): the encoder on its input
  tokens, unpadded, and the decoder on its target tokens, padded (self-attention over the targets,
  cross-attention over the inputs, whose keys and values are projected once per input), the vocabulary
  projection on the real target tokens only (seq2seq.teacher_forced_loss);
- causal LM: the decoder on T tokens, the vocabulary on the T - 1 that have a next token; a decoder's
  prefix LM: the decoder on T tokens, the vocabulary on the continuation only (T - P positions for a
  split point P uniform in [1, T - 1]: T / 2 on average), as PrefixLM computes it;
- an encoder-decoder's prefix LM: the prefix (+ </s>) in, the continuation (+ </s>) out, each side padded
  to the longest of its micro-batch: the expected largest of `micro_batch` uniform split points
  (padded_split), T / 2 + 1 a side for one example a micro-batch, near T + 1 for many; its vocabulary
  projection on the continuation's T / 2 + 1 tokens on average, whatever the micro-batch;

What runs depends on the data where examples are shorter than T or hold special tokens: a micro-batch
is padded to its longest example, and a masked LM selects `rate` of the maskable tokens (not [CLS], [SEP],
padding). The trainer runs the model through lmforge.optimize, which unpads every encoder pass in training
(fast/execution.py; not a decoder cross-attending, a compiled model, nor under a forward hook): its
position-wise layers run on the real tokens only, the embedding's E -> d projection on the padded ones,
attention per sequence on its real length (sum of L^2 keys x queries) where the mask is padding alone
and there is no attention dropout, else re-padded (P^2 each: packed_body, per_sequence). Charged on the
padded length, equal counted FLOPs had been unequal compute (COUNTING 5, measured against the unpadded
run: the roberta plan's arms 20-54 % over, by their padding share, t5's prefix LM 18 %, span corruption
0 %). The count follows the CPU; on CUDA a bidirectional mask of padding alone attends per sequence with
dropout too (one jagged call), which the count charges re-padded: the CPU plans' arms would be counted
2-7 % over what a GPU runs, more the more padding (the roberta plan's 3 % to 7 %). Shares (measured by
bakeoff/sample.py on a fixed sample of the arm's own examples) says what part of T each of these is;
without it (Shares()) every example is charged at the full T, padding included, every position maskable:
an upper bound. With them a step's count is within about 1 % of what torch's FlopCounterMode measures on
the arm's batches run unpadded (SpanBERT's spans, which never touch a text's ends, fall a little short of
`rate` in short texts: charged at `rate`). Decoders, span corruption and prefix LMs are charged as above
at T (their blocks fill T); a denoiser at its Shares (BART's documents fall short of T; T5's BERT-style and
deshuffling blocks, with the </s> they append, fill it).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from lmforge.config import ModelConfig
from lmforge.layers.positions import BIASES
from lmforge.objectives import ObjectiveSpec
from lmforge.objectives.denoising import Denoising
from lmforge.objectives.electra_mlm import ElectraMLM
from lmforge.objectives.keywords import objective_options
from lmforge.objectives.mlm import MaskedLM
from lmforge.objectives.prefix_lm import build_prefix_lm
from lmforge.objectives.rtd import ReplacedTokenDetection, generator_config
from lmforge.objectives.spanbert import SpanMLM
from lmforge.objectives.structbert import StructuralMLM
from lmforge.objectives.t5_span_corruption import SpanCorruption, block_length, noise_counts
from lmforge.pipelines.summary import flops_per_token, projection_width

# the counting's revision: a change here buys an arm other steps for the same budget, so a pretraining
# (and its results) stamped under another revision runs again (bakeoff/fingerprint.py); 2: the heads and
# networks charged on the positions they run on (Shares), span corruption and prefix LM as written; 3: the
# vocabulary projection (and SBO) at the width it reads (d_model for an untied decoder without a transform),
# an encoder-decoder's decoder's own E -> d projection, a causal LM's vocabulary on T - 1 positions; 4: an
# encoder-decoder's vocabulary on its real target tokens (a prefix LM's T / 2 + 1, not its padded side), a
# denoiser at its Shares; 5: T5's denoisers' Shares with the </s> they append (ExampleFormat.reserve); 6: an
# encoder pass on its real tokens, as the trainer unpads it (packed_body; the roberta plan's arms had been
# 20-54 % over what ran, t5's prefix LM 18 %, its span corruption 0 %)
COUNTING = 6

BACKWARD_FACTOR = 3  # forward + backward (about 2x the forward)
TOLERANCE = 0.02  # each arm's counted FLOPs within 2 % of the plan's budget


class NoFlopCount(ValueError):
    """An objective (or architecture) whose training FLOPs forward_flops does not count: XLNet's
    permutation LM, ELMo's biLM."""


@dataclass(frozen=True)
class Shares:
    """What share of an example's T positions each data-dependent part runs on: measured on a sample of
    an arm's examples (bakeoff/sample.py); 1 each (the default): every position, an upper bound."""

    padded: float = 1.0  # the length a micro-batch is padded to (expected): where the networks run
    tokens: float = 1.0  # non-padding tokens: All-Tokens MLM's and a denoiser's vocabulary projection
    maskable: float = 1.0  # non-special, non-padding tokens: what a masked LM selects `rate` of
    squared: float = 1.0  # the mean squared number of non-padding tokens, over T^2: attention per sequence

    def __post_init__(self) -> None:
        # a text of special tokens alone: nothing maskable
        for name in ("padded", "tokens", "maskable", "squared"):
            value, low = getattr(self, name), 0 if name == "maskable" else 1e-9
            if not (isinstance(value, (int, float)) and low <= value <= 1):
                raise ValueError(f"Shares.{name} must be in [{low:g}, 1], got {value!r}")


def per_sequence(cfg: ModelConfig) -> bool:
    """Whether the trainer on the CPU attends an unpadded batch sequence by sequence (fast/execution.py:
    full attention of padding only, no position bias or rotation, no attention dropout); else re-padded."""
    plain = cfg.position not in (*BIASES, "rotary", "xl-relative") and cfg.attention_dropout == 0
    return plain and all(pattern == "full" for pattern in cfg.layer_patterns())


def packed_body(cfg: ModelConfig, tokens: float, padded: float, squared: float) -> float:
    """Forward FLOPs of an encoder pass without its LM head, unpadded as the trainer runs it (fast/packing.py)
    for an example of `tokens` real tokens (mean squared length `squared`) in a micro-batch padded to
    `padded`: the embedding's E -> d projection on the padded positions (it runs before packing), every
    other position-wise layer on the real tokens, attention per sequence (per_sequence: `squared` keys
    x queries) or re-padded (`padded` each)."""
    one, two = (flops_per_token(cfg, n, lm_head=False) for n in (1, 2))
    fixed = 2 * one - two  # a token's FLOPs whatever its keys: projections, FFN, the embedding's
    embed = 2 * cfg.embed_dim * cfg.d_model if cfg.embed_dim != cfg.d_model else 0
    if per_sequence(cfg):  # full attention: linear in the keys
        attention = squared * (two - one)
    else:
        attention = padded * (flops_per_token(cfg, max(1, round(padded)), lm_head=False) - fixed)
    return tokens * (fixed - embed) + padded * embed + attention


def _body(cfg: ModelConfig, T: int, shares: Shares) -> float:
    """Forward FLOPs of an encoder without its LM head on one example of shares.tokens x T real tokens in a
    micro-batch padded to shares.padded x T, unpadded (packed_body); no more real tokens than that length
    (Shares(padded=0.5): every position of it real)."""
    padded = shares.padded * T
    return packed_body(cfg, min(shares.tokens * T, padded), padded, min(shares.squared * T * T, padded ** 2))


def head_flops(cfg: ModelConfig, context: int) -> int:
    """Forward FLOPs of the LM head for one token: the transform and the vocabulary projection."""
    return flops_per_token(cfg, context, lm_head=True) - flops_per_token(cfg, context, lm_head=False)


def _encoder_config(cfg: ModelConfig) -> ModelConfig:
    """An encoder-decoder's encoder alone (the same fields, no decoder)."""
    return cfg.replace(architecture="encoder", n_decoder_layers=None)


def _pair_head(cfg: ModelConfig, n_labels: int) -> int:
    """Forward FLOPs of a sentence classifier, once an example: the pooler (d x d), then d -> n_labels."""
    return 2 * (cfg.d_model ** 2 + n_labels * cfg.d_model)


def _masked_lm(cls, cfg: ModelConfig, options: dict, T: int, shares: Shares) -> dict:
    rate, maskable = options["rate"], shares.maskable * T
    charges = {"encoder": _body(cfg, T, shares), "lm_head": rate * maskable * head_flops(cfg, T)}
    if options.get("task") in ("nsp", "sop"):  # is-next / in-order: a 2-way classifier
        charges["pair_head"] = _pair_head(cfg, 2)
    if issubclass(cls, StructuralMLM):  # the shuffled trigrams: wso_rate of the maskable tokens left unmasked
        charges["wso_head"] = options["wso_rate"] * (1 - rate) * maskable * head_flops(cfg, T)
        if options.get("sso"):  # next / previous / other document
            charges["pair_head"] = _pair_head(cfg, 3)
    # SBO: W1 (3d -> d) and W2 (d -> E) before the MLM's projection, E the width it reads (projection_width:
    # d_model for an untied decoder without a transform, where the embedding width had been charged)
    if issubclass(cls, SpanMLM) and getattr(cls, "uses_sbo", True):
        d, E = cfg.d_model, projection_width(cfg)
        charges["sbo"] = rate * maskable * (2 * (3 * d * d + d * E) + 2 * E * cfg.vocab_size)
    return charges


def _electra(cls, cfg: ModelConfig, options: dict, T: int, shares: Shares) -> dict:
    d, selected = cfg.d_model, options["rate"] * shares.maskable * T
    gen = options.get("generator") or generator_config(cfg, options.get("ratio"))
    charges = {"generator": _body(gen, T, shares), "generator_lm_head": selected * head_flops(gen, T),
               "discriminator": _body(cfg, T, shares)}
    if not issubclass(cls, ElectraMLM):  # the RTD head scores every padded position
        return {**charges, "rtd_head": shares.padded * T * 2 * (d * d + d)}
    if options.get("all_tokens"):  # every token's vocabulary projection and copy gate (d -> 1), no padding
        tokens = shares.tokens * T
        return {**charges, "lm_head": tokens * head_flops(cfg, T), "copy_gate": tokens * 2 * d}
    return {**charges, "lm_head": selected * head_flops(cfg, T)}


def expected_longest(lengths, micro_batch: int) -> float:
    """The expected longest of `micro_batch` examples drawn from `lengths`: the length their micro-batch is
    padded to, sum over k of P(longest >= k) = 1 - F(k - 1)^micro_batch."""
    lengths = np.sort(np.asarray(lengths))
    below = np.searchsorted(lengths, np.arange(int(lengths[-1])), side="right") / len(lengths)  # F(k - 1)
    return float(np.sum(1.0 - below ** micro_batch))


def padded_split(T: int, micro_batch: int = 1) -> float:
    """The expected longest of `micro_batch` split points P uniform in [1, T - 1] (T - P alike): the
    length a micro-batch of prefixes (continuations) is padded to; T / 2 for one example."""
    return expected_longest(range(1, max(int(T) - 1, 1) + 1), micro_batch)


def seq2seq_lengths(cls, options: dict, T: int, micro_batch: int = 1, shares: Shares | None = None) -> tuple:
    """(encoder tokens, decoder tokens) of an encoder-decoder objective's example of T tokens, padded.

    T5's span corruption (Raffel et al. 2020, sec. 3.1.4) reads blocks of n raw tokens, n as T5's
    random_spans_helper sizes them so that the corrupted input fills T (568 for 512: block_length); it
    keeps n - k tokens plus one sentinel per span and </s>; the target is the k dropped tokens plus the
    sentinels, the final sentinel (final_sentinel) and </s>: k and the spans rounded as the objective
    rounds them (noise_counts; 512: 512 in, 115 out). A prefix LM splits at a uniform point, each side
    + </s> and padded to the longest of its micro-batch (padded_split); a denoiser reads and writes its
    example, padded to its micro-batch's longest (shares.padded: T for blocks; BART's documents are shorter),
    the input charged at the text's length though its noise may shorten it (infilling): an upper bound."""
    cls = cls if isinstance(cls, type) else type(None)
    if issubclass(cls, SpanCorruption):
        n = block_length(int(T), options)
        noise, spans = noise_counts(n, options.get("noise_density", 0.15),
                                    options.get("mean_noise_span_length", 3.0))
        final = 1 if options.get("final_sentinel", True) else 0
        return n - noise + spans + 1, noise + spans + final + 1
    if issubclass(cls, Denoising):
        return ((shares or Shares()).padded * T,) * 2
    side = padded_split(T, micro_batch) + 1
    return side, side


def _predicted(cls, options: dict, T: int, shares: Shares) -> float:
    """Target tokens of an example the vocabulary projection runs on: the real ones, not the padding
    (teacher_forced_loss): span corruption's (one length), a denoiser's text, a prefix LM's continuation
    + </s> (T / 2 + 1 on average, where its micro-batch is padded to near T + 1)."""
    if isinstance(cls, type) and issubclass(cls, SpanCorruption):
        return seq2seq_lengths(cls, options, T)[1]
    if isinstance(cls, type) and issubclass(cls, Denoising):
        return shares.tokens * T
    return padded_split(T) + 1


def _real_inputs(cls, options: dict, T: int, shares: Shares) -> tuple:
    """(real tokens, their mean square) of an encoder-decoder's input, the encoder's unpadded length: span
    corruption's blocks fill their length, a denoiser's text its Shares, a prefix LM's prefix + </s>."""
    if isinstance(cls, type) and issubclass(cls, SpanCorruption):
        n_in = seq2seq_lengths(cls, options, T)[0]
        return n_in, n_in ** 2
    if isinstance(cls, type) and issubclass(cls, Denoising):
        return shares.tokens * T, shares.squared * T * T
    sides = np.arange(2, max(int(T) - 1, 1) + 2)  # P + 1 for a split point P uniform in [1, T - 1]
    return float(sides.mean()), float((sides ** 2).mean())


def _seq2seq(cls, cfg: ModelConfig, options: dict, T: int, micro_batch: int, shares: Shares) -> dict:
    """The encoder on n_in tokens, unpadded (packed_body); the decoder on n_out padded (cross-attention keeps
    the padded layout), its self-attention over the n_out targets, its cross-attention over the n_in inputs,
    whose keys and values are projected once per input token; the vocabulary projection on the real target
    tokens (_predicted)."""
    n_in, n_out = seq2seq_lengths(cls, options, T, micro_batch, shares)
    keys_in, keys_out = max(1, round(n_in)), max(1, round(n_out))
    # flops_per_token charges a decoder token's self- and cross-attention over the same `context`, and
    # cross-attention's k, v projections per decoder token: right where n_in == n_out (BART, prefix LM),
    # not for T5's span corruption (targets a quarter of the input): counted at n_out, then mended
    decoder = flops_per_token(cfg, keys_out, lm_head=False) - flops_per_token(_encoder_config(cfg), keys_out,
                                                                             lm_head=False)
    q_dim, kv_dim = cfg.n_heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim
    cross = 2 * cfg.decoder_layers * (n_out * 2 * (keys_in - keys_out) * q_dim  # scores, mixing: n_in keys
                                      + (n_in - n_out) * 2 * cfg.d_model * kv_dim)  # k, v of each input
    real, squared = _real_inputs(cls, options, T, shares)  # no more than the padded length holds
    return {"encoder": packed_body(_encoder_config(cfg), min(real, n_in), n_in, min(squared, n_in ** 2)),
            "decoder": n_out * decoder + cross,
            "lm_head": _predicted(cls, options, T, shares) * head_flops(cfg, keys_out)}


READS_SHARES = (MaskedLM, ReplacedTokenDetection, ElectraMLM, Denoising)  # masked LMs, ELECTRA's, denoisers


def reads_shares(spec: ObjectiveSpec) -> bool:
    """Whether forward_flops charges `spec` by the Shares of its examples (READS_SHARES' objectives)."""
    cls = getattr(spec.build, "__self__", None)
    return isinstance(cls, type) and issubclass(cls, READS_SHARES)


def forward_flops(spec: ObjectiveSpec, cfg: ModelConfig, T: int, options: dict | None = None,
                  micro_batch: int = 1, shares: Shares | None = None) -> dict:
    """Forward FLOPs of one example of T tokens under objective `spec`, in micro-batches of `micro_batch`
    examples (what an encoder-decoder's prefix LM pads to), by network (see the module); `shares`: what
    the arm's examples hold (None: every position a maskable token, an upper bound)."""
    options, shares = objective_options(spec, options or {}), shares or Shares()
    cls = getattr(spec.build, "__self__", None)
    if isinstance(cls, type) and issubclass(cls, (ReplacedTokenDetection, ElectraMLM)):
        return _electra(cls, cfg, options, T, shares)
    if isinstance(cls, type) and issubclass(cls, MaskedLM):
        return _masked_lm(cls, cfg, options, T, shares)
    if cfg.architecture == "encoder-decoder":
        return _seq2seq(cls, cfg, options, T, micro_batch, shares)
    if cfg.architecture == "decoder":
        body = {"decoder": T * flops_per_token(cfg, T, lm_head=False)}
        if spec.build is build_prefix_lm:  # the vocabulary on the continuation only: T / 2 on average
            return {**body, "lm_head": padded_split(T) * head_flops(cfg, T)}
        return {**body, "lm_head": (T - 1) * head_flops(cfg, T)}  # the last token has nothing to predict
    raise NoFlopCount(f"no FLOP count for objective {spec.name!r} on an {cfg.architecture} model (the "
                      "bake-off counts masked LMs, ELECTRA's, causal and prefix LMs and encoder-decoders)")


@dataclass(frozen=True)
class Schedule:
    """An arm's share of the budget: its steps, FLOPs per step and by network, and the Shares of its
    examples they were counted with ({}: none measured, every position charged)."""

    steps: int
    flops_per_step: float
    flops: float
    by_network: dict
    shares: dict = field(default_factory=dict)

    def error(self, budget: float) -> float:
        """Relative distance of the counted FLOPs from `budget`."""
        return abs(self.flops - budget) / budget


def schedule(spec: ObjectiveSpec, cfg: ModelConfig, T: int, examples_per_step: int, budget: float,
             options: dict | None = None, micro_batch: int | None = None,
             shares: Shares | None = None) -> Schedule:
    """The steps that spend `budget` training FLOPs: round(budget / FLOPs per step); examples come in
    micro-batches of `micro_batch` (None: the whole step's in one), holding `shares` (forward_flops)."""
    forward = forward_flops(spec, cfg, T, options, micro_batch or examples_per_step, shares)
    per_step = BACKWARD_FACTOR * examples_per_step * sum(forward.values())
    steps = max(1, round(budget / per_step))
    by_network = {k: BACKWARD_FACTOR * examples_per_step * v for k, v in forward.items()}
    measured = dataclasses.asdict(shares) if shares else {}
    return Schedule(steps, per_step, steps * per_step, by_network, measured)
