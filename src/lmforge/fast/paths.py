"""Execution choices that change speed and memory, never results (beyond float rounding).

They belong to a model instance (given by `lmforge.optimize(model, paths=FastPaths(...))`), not to its
config: they are not saved, and every choice is tested against the path it replaces
(tests/fast/test_fastpath.py, test_linear.py, test_native_attention.py). Generation's own
speed options are arguments of `lmforge.generate` (generate/vocab/).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from lmforge.config.options import check_options, option

UNPAD = ("auto", "always", "never")
LOCAL_ATTENTION = ("auto", "blocked", "dense")
JAGGED = ("auto", "always", "never")
# "auto" packs the real tokens of a batch when at least this share of it is padding: below it
# packing costs about what it saves in inference (bench/FINDINGS.md: at 3.5 % padding bert-base
# gains 2 % and bert-mini loses 6 %; at 7-8 % bert-base gains 10 %, bert-mini breaks even, and
# all-MiniLM-L6-v2 on short sentences gains 5 %).
# Training packs at any padding: the backward pass doubles the saving (MiniLM fine-tuning
# with ~9 % padding: 6.0 s vs 6.5 s per 12 steps, bench/FINDINGS.md)
UNPAD_MIN_PADDING = 0.05
# a chunk's band of keys is allocated per pass and a threshold past any context changes nothing: both
# bounded (2^16 is twice the longest context of the presets)
MAX_CHUNK = MAX_LENGTH = 1 << 16


@dataclass
class FastPaths:
    """How a model's forward runs: unpadding, per-sequence or blocked attention, CPU accelerations."""

    # pack real tokens for every position-wise layer (embeddings, projections, FFN, norms);
    # attention re-pads them per layer, so each sequence only ever sees itself. Padded rows of
    # the output are then zeros: "auto" keeps the padded path when a per-token head (LM, tagging)
    # reads them, as the reference computes them and a loss over them (labels on padding) needs them
    unpad: str = option("auto", "pack the batch's real tokens", choices=UNPAD)
    # unpadded full attention sequence by sequence (sum of L^2 scores, B calls a layer, no mask) instead
    # of re-padding (B T^2 scores, one call): bench/RESULTS.md, 1.6x vs 1.2x the reference on bert-mini
    sequence_attention: bool = option(True, "unpadded full attention sequence by sequence")
    # ... but in inference only when the batch's longest sequence has at least this many tokens:
    # below it the B small calls a layer (each a parallel region) cost more than the few padded
    # scores of one re-padded call (all-MiniLM-L6-v2, 32 texts of ~14 tokens, bench/FINDINGS.md)
    sequence_min_length: int = option(32, "... in inference from this longest length on", low=0,
                                      high=MAX_LENGTH)
    # windowed patterns (sliding-window, dilated, longformer, bigbird) in query chunks against
    # their key band (linear in T) instead of a dense (T, T) mask; "auto": when the band is short
    local_attention: str = option("auto", "windowed patterns in query chunks", choices=LOCAL_ATTENTION)
    # packed rows of a bidirectional mask of padding only in one SDPA call over a nested jagged tensor
    # (variable-length attention: flash / memory-efficient kernels on CUDA, no mask, no padding);
    # "auto": on CUDA, where it replaces B calls a layer by one; the CPU keeps its measured choices above
    jagged_attention: str = option("auto", "packed rows in one nested jagged SDPA call", choices=JAGGED)
    # bidirectional attention of padding-only masks in inference by lmforge's native kernel (fp32 CPU,
    # fast/native_attention.py: all sequences and heads in one parallel region, packed rows included)
    # instead of SDPA: 2.3x SDPA's attention at MiniLM's long texts on two threads (bench/FINDINGS.md).
    # Where it runs it comes first: sequence_attention and jagged_attention then choose for the rest
    native_attention: bool = option(True, "bidirectional attention by the native kernel")
    # fp32 CPU inference products by oneDNN's linear (fast/linear.py) instead of F.linear's MKL sgemm:
    # 4-18 % faster on MiniLM's and BERT's shapes, 1.6-2.8x on a decoding step's rows (bench/FINDINGS.md);
    # equal within float rounding, not bitwise
    onednn_linear: bool = option(True, "fp32 CPU inference products by oneDNN's linear")
    # ... on a copy of each weight in oneDNN's blocked layout, for weights frozen from optimize on (a job
    # that only runs the model: `FastPaths.frozen()`): 2-5 % on a batch's products, 25-35 % on a text's few
    # rows, for a second copy of every weight oneDNN runs (bench/FINDINGS.md, "Packed weights"). Off by
    # default: the copy is packed again when the weight's Parameter, storage or version counter changes,
    # or after a forward with gradients or a change between train() and eval(), but a fused AdamW step
    # and writes through `.data` (a tied weight's too) leave the version counter as it was, so a model
    # whose weights change otherwise must be optimized again
    packed_weights: bool = option(False, "oneDNN's linear on weights packed once, read as frozen (a second "
                                  "copy)")
    # calls too small to repay the faster kernels' set-up keep the plain ones: oneDNN's linear costs ~15 us
    # a call before any work and the native attention ~30 us more than SDPA, so a call of under 2^19
    # multiply-adds (rows x weight values) stays on F.linear (fast/linear.py), and a pass of under 512
    # query rows x heads attends by SDPA (fast/execution.py): bert-tiny at batch 1 ran 1.7x slower
    # optimized (bench/FINDINGS.md). False: the faster kernels at every size
    small_calls_plain: bool = option(True, "calls too small to repay the faster kernels keep the plain ones")
    chunk: int = option(0, "queries per chunk of blocked attention; 0: chosen from the window", low=0,
                        high=MAX_CHUNK)
    # turn the layers into their accelerated subclasses (fast/optimize.py), once
    accelerate: bool = option(True, "the layers as their accelerated subclasses")

    def __post_init__(self) -> None:
        # each field's type, bounds and choices (an OptionsError naming it): "no" for a flag would
        # switch it on, a string chunk failed inside a comparison, a huge one allocated its band
        check_options(self)

    @classmethod
    def frozen(cls, **choices) -> FastPaths:
        """Every default choice (or `choices`) with the weights read as frozen (packed once): for a job
        that only runs the model it loaded (embed, serve, generate)."""
        return cls(**{"packed_weights": True, **choices})

    def wants_jagged(self, device: torch.device) -> bool:
        """Whether packed rows of bidirectional padding-only masks attend as one nested jagged call."""
        return self.jagged_attention == "always" or (self.jagged_attention == "auto" and
                                                     device.type == "cuda")

    def wants_unpad(self, mask, keep_padding: bool = False, training: bool = False) -> bool:
        """Whether to pack the batch whose (B, T) bool mask is `mask` (True at real tokens);
        keep_padding: the padded rows of the output will be read; training: a backward pass follows."""
        if mask is None or self.unpad == "never" or (keep_padding and self.unpad == "auto"):
            return False
        if torch.compiler.is_compiling():
            return False  # packing's shapes depend on the mask's values: a compiled graph stays padded
        padding = 1.0 - float(mask.sum()) / mask.numel()
        return padding > 0 and (self.unpad == "always" or training or padding >= UNPAD_MIN_PADDING)
