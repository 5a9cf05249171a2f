"""The shares of an arm's examples its FLOP count reads (flops.Shares), measured once per plan.

A masked LM selects `rate` of an example's maskable tokens (not [CLS], [SEP], padding) and a micro-batch
is padded to its longest example: on short documents both fall well under max_len, and charging every
position over-charged the masked-LM arms by 3-16 % (max_len 32, the built-in corpus): more than the plan's
tolerance, and by different amounts per arm. The shares are measured on the arm's own examples, built as
pretrain builds them (its corpus, example format, max_len and objective options), from the corpus's first
SAMPLE_DOCUMENTS documents with seed 0: deterministic, so a dry run and the run count the same steps.
"""
from __future__ import annotations

from itertools import islice

import numpy as np

from lmforge.bakeoff.flops import Shares, expected_longest, reads_shares
from lmforge.data.corpus import CorpusReader
from lmforge.data.stream import build_examples
from lmforge.objectives.base import tokenizer_pad, tokenizer_specials

# a change to these changes the steps a budget buys: bump flops.COUNTING with it (runs stamped before rerun)
SAMPLE_DOCUMENTS = 2000  # documents read for the sample (a corpus may hold 10^6)
SAMPLE_EXAMPLES = 4096  # examples measured: each share known to well under 1 %


def measure(examples, special: set, T: int, micro_batch: int, reserve: int = 0) -> Shares:
    """The Shares of `examples` (their first SAMPLE_EXAMPLES) of up to T tokens, in micro-batches of
    `micro_batch`: padded length, non-padding and maskable (not `special`) tokens, each over T, and the
    mean squared non-padding length over T^2 (attention sequence by sequence); `reserve`:
    the special tokens its objective appends to each (ExampleFormat.reserve: T5's </s>), run on too."""
    rows = [e["input_ids"] for e in islice(examples, SAMPLE_EXAMPLES)]
    if not rows:  # no example to measure: every position, the upper bound
        return Shares()
    lengths = [len(r) + reserve for r in rows]
    maskable = sum(sum(t not in special for t in r) for r in rows) / len(rows)
    return Shares(padded=min(1.0, expected_longest(lengths, micro_batch) / T),
                  tokens=min(1.0, float(np.mean(lengths)) / T), maskable=min(1.0, maskable / T),
                  squared=min(1.0, float(np.mean(np.square(lengths))) / T ** 2))


def sample_documents(corpus: list, tokenizer, cache: dict) -> list:
    """The first SAMPLE_DOCUMENTS documents of `corpus` (its files), tokenized as pretrain tokenizes them
    (kept in `cache`, by paths: arms share a corpus)."""
    from lmforge.train.pretrain import tokenize_documents

    key = tuple(map(str, corpus))
    if key not in cache:
        cache[key] = tokenize_documents(tokenizer, list(islice(CorpusReader(list(corpus)), SAMPLE_DOCUMENTS)))
    return cache[key]


def arm_shares(plan, arm, spec, tokenizer, corpus: list, T: int, micro_batch: int,
               cache: dict) -> Shares | None:
    """The Shares of the examples `arm` (objective `spec`) builds from `corpus` at max_len T with
    `tokenizer` (`cache`: sample_documents'); None (the upper bound) for an arm that reads with a
    checkpoint's tokenizer."""
    root = arm
    while root.continue_from is not None:
        root = plan.arm(root.continue_from)
    if root.model is not None:
        return None
    examples = build_examples(spec.examples, sample_documents(corpus, tokenizer, cache), tokenizer, T, 0,
                              spec.options)
    special = set(tokenizer_specials(tokenizer)) | {tokenizer_pad(tokenizer)}  # as MaskedLM skips them
    # T5's denoisers append </s> to input and target: blocks of T - 1 raw tokens run at T (measured at T - 1
    # without it, their count fell about 4 % short at T = 32: tests/bakeoff/test_sample.py)
    return measure(examples, special, T, micro_batch, spec.examples.reserve)


class Sampler:
    """measure(arm, spec, T, micro_batch) -> the Shares of an arm's examples, or None (the upper bound)
    for an objective charged without them or an arm reading with a checkpoint's tokenizer."""

    def __init__(self, run) -> None:
        self.run = run  # a runner.BakeOff: its plan, tokenizer and corpus_of(arm)
        self.cache: dict = {}  # corpus -> its first documents, tokenized: arms share a corpus

    def __call__(self, arm, spec, T: int, micro_batch: int) -> Shares | None:
        if not reads_shares(spec):
            return None
        run = self.run
        return arm_shares(run.plan, arm, spec, run.tokenizer, run.corpus_of(arm), T, micro_batch, self.cache)
