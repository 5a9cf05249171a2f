"""T5's span corruption (Raffel et al. 2020, sec. 3.1.4 and fig. 2; sec. 3.3.4 for the spans).

The noise mask follows T5's `random_spans_noise_mask`: of L tokens, round(L x 0.15) are
noise (at least 1, at most L - 1) in round(noise / 3) spans (at least 1); the noise
tokens and the non-noise tokens are each cut into that many non-empty runs by a uniformly
random segmentation, and the runs alternate non-noise, noise, non-noise, ... — so a text
starts with kept tokens and ends with a noise span. Rounding is T5's: float32 products,
ties to even.

The input keeps the non-noise tokens and replaces noise span i by the sentinel <extra_id_i>
(in T5's vocabulary the sentinels count down from the last id: look them up with
`sentinel_ids(tokenizer)`). The target is <extra_id_i> then span i's tokens for every span,
then a final sentinel, then </s>; the input ends in </s> too. Fig. 2's layout: "Thank you
<X> me to your party <Y> week." -> "<X> for inviting <Y> last <Z>". (T5's code drops the
final sentinel: its mask always ends in noise, and it turns the non-noise runs, of which
there are as many as spans, into the target's sentinels. The paper's final sentinel tells
the decoder the last span is over; `final_sentinel=False` gives the code's targets.)
"""
from __future__ import annotations

import torch

from lmforge.data.stream import ExampleFormat
from lmforge.objectives.base import tokenizer_pad, within
from lmforge.objectives.registry import ObjectiveSpec, register
from lmforge.objectives.seq2seq import Seq2SeqLM

N_SENTINELS = 100  # T5's <extra_id_0> .. <extra_id_99>


def sentinel_ids(tokenizer, n: int = N_SENTINELS) -> list:
    """Ids of <extra_id_0>, <extra_id_1>, ... in `tokenizer` (T5: descending from the last id)."""
    ids = [tokenizer.token_to_id(f"<extra_id_{i}>") for i in range(n)]
    if any(i is None for i in ids):
        raise ValueError(f"span corruption needs the sentinels <extra_id_0>..<extra_id_{n - 1}> "
                         "in the tokenizer (train one with family='t5')")
    return ids


def random_segmentation(num_items: int, num_segments: int, generator: torch.Generator) -> list:
    """Lengths of `num_segments` non-empty runs covering `num_items` items, every cut equally likely:
    num_segments - 1 of the num_items - 1 gaps between items, chosen uniformly."""
    cuts = torch.zeros(num_items - 1, dtype=torch.bool)
    cuts[: num_segments - 1] = True
    cuts = cuts[torch.randperm(num_items - 1, generator=generator)]
    lengths, run = [], 1
    for cut in cuts.tolist():
        if cut:
            lengths.append(run)
            run = 0
        run += 1
    return lengths + [run]


def noise_counts(length: int, noise_density: float, mean_noise_span_length: float) -> tuple:
    """(noise tokens, noise spans) of a text of `length` tokens, rounded as T5 rounds them."""
    length = max(length, 2)
    f32 = torch.float32
    num_noise = int(torch.round(torch.tensor(length, dtype=f32) * noise_density))
    num_noise = min(max(num_noise, 1), length - 1)  # some noise and some kept tokens
    num_spans = int(torch.round(torch.tensor(num_noise, dtype=f32) / mean_noise_span_length))
    # at least one span; never more spans than kept runs to separate them (only at extreme densities)
    return num_noise, min(max(num_spans, 1), length - num_noise)


def raw_length(inputs_length: int, noise_density: float = 0.15, mean_noise_span_length: float = 3.0) -> int:
    """T5's random_spans_helper: the most raw tokens whose corrupted input, </s> included, fits in
    inputs_length (512 -> 568, the targets then 114 tokens, 115 with the final sentinel)."""
    def corrupted(n: int) -> int:
        noise, spans = noise_counts(n, noise_density, mean_noise_span_length)
        return n - noise + spans + 1

    n = max(inputs_length - 1, 1)  # fits: a text never grows by more than its </s>
    while corrupted(n + 1) <= inputs_length:
        n += 1
    return n


def block_length(max_len: int, options: dict) -> int:
    """The raw tokens of a block whose corruption, by the objective's `options`, fills max_len."""
    return raw_length(max_len, options.get("noise_density", 0.15), options.get("mean_noise_span_length", 3.0))


def random_spans_noise_mask(length: int, generator: torch.Generator, noise_density: float = 0.15,
                            mean_noise_span_length: float = 3.0) -> list:
    """length bools, True at noise: alternating non-noise / noise runs, starting with non-noise."""
    num_noise, num_spans = noise_counts(length, noise_density, mean_noise_span_length)
    noise_lengths = random_segmentation(num_noise, num_spans, generator)
    kept_lengths = random_segmentation(max(length, 2) - num_noise, num_spans, generator)
    mask = []
    for kept, noise in zip(kept_lengths, noise_lengths):
        mask += [False] * kept + [True] * noise
    return mask[:length]  # a one-token text: T5 draws for two and keeps the first


def corrupt_spans(tokens: list, noise_mask: list, sentinels: list, eos: int | None,
                  final_sentinel: bool = True) -> tuple:
    """(input, target): noise span i -> sentinels[i] in the input; the target lists each sentinel
    and its span, then (final_sentinel) the next sentinel; eos ends both."""
    inputs, targets, span = [], [], -1
    for i, (token, noise) in enumerate(zip(tokens, noise_mask)):
        if not noise:
            inputs.append(token)
            continue
        if i == 0 or not noise_mask[i - 1]:  # a span starts
            span += 1
            if span + final_sentinel >= len(sentinels):
                raise ValueError(f"{span + 1 + final_sentinel} sentinels needed, the tokenizer has "
                                 f"{len(sentinels)}: use shorter texts")
            inputs.append(sentinels[span])
            targets.append(sentinels[span])
        targets.append(token)
    if final_sentinel:
        targets.append(sentinels[span + 1])
    end = [eos] if eos is not None else []
    return inputs + end, targets + end


class SpanCorruption(Seq2SeqLM):
    """T5's unsupervised objective: sentinel-replaced spans in, the spans out (teacher forcing)."""

    name = "span-corruption"
    bounds = {**Seq2SeqLM.bounds, "noise_density": within(0, 1, above=True, below=True),
              "mean_noise_span_length": within(1)}

    def __init__(self, model, sentinel_ids: list, eos_id: int | None, noise_density: float = 0.15,
                 mean_noise_span_length: float = 3.0, final_sentinel: bool = True, pad_id: int = 0,
                 decoder_start_id: int | None = None) -> None:
        super().__init__(model, pad_id, decoder_start_id)
        self.check_values({"noise_density": noise_density, "mean_noise_span_length": mean_noise_span_length})
        self.sentinels, self.eos_id = list(sentinel_ids), eos_id
        self.noise_density, self.mean_noise_span_length = noise_density, mean_noise_span_length
        self.final_sentinel = final_sentinel

    @classmethod
    def build(cls, model, tokenizer, **options) -> SpanCorruption:
        """T5's objective around `model`, with the tokenizer's sentinels, eos and pad (the start: the
        config)."""
        return cls(model, sentinel_ids(tokenizer), tokenizer.special_id("eos"),
                   pad_id=tokenizer_pad(tokenizer), **options)

    def corrupt(self, example: dict, generator: torch.Generator) -> dict:
        """Raw tokens (no eos) -> the corrupted input and the target, as input_ids and labels."""
        tokens = list(example["input_ids"])
        mask = random_spans_noise_mask(len(tokens), generator, self.noise_density,
                                       self.mean_noise_span_length)
        inputs, targets = corrupt_spans(tokens, mask, self.sentinels, self.eos_id, self.final_sentinel)
        return {"input_ids": inputs, "labels": targets}


# raw token blocks, documents concatenated without a separator as T5's reduce_concat_tokens does (a </s>
# joining them would stand mid-target), as long as T5 takes them: the corrupted input plus </s> fills max_len
register(ObjectiveSpec(name="span-corruption", build=SpanCorruption.build, summary="span corruption (T5)",
                       aliases=("t5",), architectures=("encoder-decoder",), tokenizer="t5",
                       examples=ExampleFormat("blocks", roles=(), length=block_length)))
