"""Execution choices that change speed and memory, never results (beyond float rounding).

They belong to a model instance, not to its config: they are not saved, and every
choice is tested against the reference path it replaces (tests/layers/test_fastpath.py).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

UNPAD = ("auto", "always", "never")
LOCAL_ATTENTION = ("auto", "blocked", "dense")
SCREENED_GREEDY = ("auto", "always", "never")
# "auto" packs the real tokens of a batch when at least this share of it is padding: below it
# packing costs about what it saves in inference (bench/FINDINGS.md: at 3.5 % padding bert-base
# gains 2 % and bert-mini loses 6 %; at 7-8 % bert-base gains 10 %, bert-mini breaks even, and
# all-MiniLM-L6-v2 on short sentences gains 5 %).
# Training packs at any padding: the backward pass doubles the saving (MiniLM fine-tuning
# with ~9 % padding: 6.0 s vs 6.5 s per 12 steps, bench/FINDINGS.md)
UNPAD_MIN_PADDING = 0.05


@dataclass
class FastPaths:
    """How a model runs: unpadding of variable-length batches and blocked local attention."""

    # pack real tokens for every position-wise layer (embeddings, projections, FFN, norms);
    # attention re-pads them per layer, so each sequence only ever sees itself. Padded rows of
    # the output are then zeros: "auto" keeps the padded path when a per-token head (LM, tagging)
    # reads them, as the reference computes them and a loss over them (labels on padding) needs them
    unpad: str = "auto"
    # unpadded full attention sequence by sequence (sum of L^2 scores, B calls a layer, no mask) instead
    # of re-padding (B T^2 scores, one call): bench/RESULTS.md, 1.6x vs 1.2x the reference on bert-mini
    sequence_attention: bool = True
    # windowed patterns (sliding-window, dilated, longformer, bigbird) in query chunks against
    # their key band (linear in T) instead of a dense (T, T) mask; "auto": when the band is short
    local_attention: str = "auto"
    chunk: int = 0  # queries per chunk of blocked attention; 0: chosen from the window
    # generation by an eval-mode model on CPU stores linear weights input-major (see weight_layout);
    # model.train() puts them back row-major
    decode_layout: bool = True
    # generation runs the cached steps of decoders and encoder-decoders through decode_step.LeanDecoder:
    # the same calls without module and feature-check overhead per layer (bench/FINDINGS.md)
    lean_decoding: bool = True
    # greedy decoding on CPU finds the argmax of the vocabulary projection from an int8 copy with a
    # rigorous error bound, re-scoring only the tokens the bound cannot rule out in fp32: the fp32
    # argmax (a near-tie within fp32 rounding may go either way, as between any two fp32 kernels),
    # reading a quarter of the projection's bytes (vocab_screen.py; the copy is cached on the head).
    # "auto" builds the copy from a model's second greedy generate call on (building it costs ~120
    # steps' projections), "always" from the first, "never" does not
    screened_greedy: str = "auto"

    def __post_init__(self) -> None:
        if self.unpad not in UNPAD:
            raise ValueError(f"unpad={self.unpad!r} is not one of {', '.join(UNPAD)}")
        if self.local_attention not in LOCAL_ATTENTION:
            raise ValueError(f"local_attention={self.local_attention!r} is not one of "
                             f"{', '.join(LOCAL_ATTENTION)}")
        if self.screened_greedy not in SCREENED_GREEDY:
            raise ValueError(f"screened_greedy={self.screened_greedy!r} is not one of {', '.join(SCREENED_GREEDY)}")
        if self.chunk < 0:
            raise ValueError(f"chunk must be >= 0, got {self.chunk}")

    def wants_unpad(self, mask, keep_padding: bool = False, training: bool = False) -> bool:
        """Whether to pack the batch whose (B, T) bool mask is `mask` (True at real tokens);
        keep_padding: the padded rows of the output will be read; training: a backward pass follows."""
        if mask is None or self.unpad == "never" or (keep_padding and self.unpad == "auto"):
            return False
        padding = 1.0 - float(mask.sum()) / mask.numel()
        return padding > 0 and (self.unpad == "always" or training or padding >= UNPAD_MIN_PADDING)


def linear_weights(model: nn.Module) -> list:
    """Every distinct weight that F.linear reads: nn.Linear weights and a (tied) LM projection."""
    weights = {id(m.weight): m.weight for m in model.modules() if isinstance(m, nn.Linear)}
    for head in getattr(model, "heads", {}).values():
        tied = getattr(head, "tied", None)
        if getattr(head, "spec", {}).get("kind") == "lm" and tied is not None:
            weights.setdefault(id(tied.weight), tied.weight)
    return list(weights.values())


def weight_layout(model: nn.Module, input_major: bool) -> None:
    """Store linear weights (out, in) as the transpose of a contiguous (in, out) tensor, or back.

    Values are unchanged, only strides. Why: a matmul with a handful of rows (decoding reads one
    new token per row) runs 1.2-2x faster on CPU reading (in, out) weights (PERF_NOTES.md:
    GPT-2's (8, 768) x (768, 50257) projection, 31 ms row-major, 16 ms input-major), while
    training's large batches prefer row-major. Relaying GPT-2 small out costs ~0.4 s, so it is
    done once and kept until model.train()."""
    if getattr(model, "_input_major", False) == input_major:
        return
    with torch.no_grad():
        for weight in linear_weights(model):
            weight.data = weight.data.t().contiguous().t() if input_major else weight.data.contiguous()
    model._input_major = input_major
