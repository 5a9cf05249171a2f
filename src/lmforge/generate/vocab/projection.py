"""The vocabulary projection of decoding steps, computed the way that is fastest on this machine.

At small batches a decoding step reads every weight once and the (V, d) vocabulary projection is
its largest read (GPT-2 small: 154 MB of ~500 MB a token). Three ways give what a step needs:

- "plain": F.linear on the weight as the model stores it, (V, d) row-major;
- "input-major": addmm on a (d, V) copy of it. oneDNN's few-row GEMM reads (in, out) weights
  faster (GPT-2's head at 1 row on an AVX2 EPYC: 7.5 vs 12.2 ms; bench/FINDINGS.md);
- "screen" (greedy only): the int8 screen of screen.py, a quarter of the bytes. GPT-2 small's
  vocabulary, one row, with the argmax: 1.16 vs 6.6 ms input-major on an AVX-512 VNNI EPYC, 1.33 vs
  7.2 ms with AVX2 code (its features then take 7-bit stages: without VNNI pairs sum in int16).
  Through oneDNN and 8-bit stages only, an AVX2-only EPYC had measured 51.6 vs 32.3 ms a token;
  taking the first exact kernel (int_mm there) its scores took 45 ms; timing the exact ones, 3.3 ms
  (w8a32 or fbgemm) against 12.5 ms input-major.

Which one wins depends on the CPU, so "auto" times every candidate once per (V, d, rows, threads)
on the first step's own features and keeps the fastest; "plain" is always a candidate, so auto is
never slower than the plain path by more than timing noise. The copies live in a weak dictionary
beside the model, keyed by its head and checked against the weights' storage, version and
fingerprint (screen.table_key) at each generate call: the model itself is never changed.
"""
from __future__ import annotations

import weakref
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from lmforge.generate.vocab.screen import GreedyScreen, ScreenTable, table_key
from lmforge.utils.timing import median_seconds

MODES = ("auto", "plain", "input-major", "screen")
MAX_COPY_BYTES = 1 << 30  # an input-major copy is another weight's worth of memory: not for huge heads
MIN_STEPS = 8  # a copy (~a step's read) or a timing (~10 steps) does not repay on fewer steps
_COPIES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # head -> _Copies
CHOICES: dict = {}  # (V, d, rows, greedy, threads) -> (fastest way, whether the screen was timed)


class _Copies:
    """A head's derived copies, valid while its weights keep `key`."""

    def __init__(self, key: tuple) -> None:
        self.key, self.input_major, self.screen, self.greedy_calls = key, None, None, 0


def _copies(head: nn.Module, weight: torch.Tensor, bias) -> _Copies:
    key = table_key(weight, bias)
    copies = _COPIES.get(head)
    if copies is None or copies.key != key:
        copies = _COPIES[head] = _Copies(key)
    return copies


class VocabProjection:
    """One generate call's vocabulary projection over `head` (an LMHead): logits, or the argmax."""

    def __init__(self, head: nn.Module, mode: str = "auto", greedy: bool = False, steps: int = 1) -> None:
        """mode: one of MODES; greedy: only argmaxes are asked for; steps: the steps the call may run."""
        if mode not in MODES:
            raise ValueError(f"projection={mode!r} is not one of {', '.join(MODES)}")
        self.head, self.mode, self.greedy = head, mode, greedy
        self.weight, self.bias = head.projection()
        self.way, self.copy, self.screen = "plain", None, None
        fp32_cpu = (self.weight.dtype == torch.float32 and self.weight.device.type == "cpu"
                    and self.weight.dim() == 2 and not torch.is_autocast_enabled("cpu"))
        self.open = mode != "plain" and fp32_cpu and (steps >= MIN_STEPS or mode != "auto")
        self.chosen = not self.open

    def logits(self, features: torch.Tensor) -> torch.Tensor:
        """(N, E) features -> (N, V) logits."""
        self._choose(features)
        if self.way == "input-major":
            return (torch.addmm(self.bias, features, self.copy) if self.bias is not None
                    else features @ self.copy)
        return F.linear(features, self.weight, self.bias)

    def argmax(self, features: torch.Tensor) -> Optional[torch.Tensor]:
        """(N, E) features -> (N,) greedy tokens through the screen, or None: take `logits` instead."""
        self._choose(features)
        return self.screen(features) if self.way == "screen" and self.screen.active else None

    def _choose(self, features: torch.Tensor) -> None:
        """Settle the way on the first step's features (the row count is known only then), building
        only what the ways still in question read."""
        if self.chosen:
            return
        self.chosen = True
        copies = _copies(self.head, self.weight, self.bias)
        copies.greedy_calls += self.greedy
        key = (*self.weight.shape, features.shape[0], self.greedy, torch.get_num_threads())
        known = CHOICES.get(key)
        # the screen's table costs ~120 full projections (GPT-2 small ~0.75 s): under auto it is
        # considered from a head's second greedy call on, and never again once timed and beaten
        screen_due = self.greedy and (self.mode != "auto" or copies.greedy_calls >= 2)
        if self.mode != "auto":
            wanted = {self.mode}
        elif known is not None and (known[1] or not screen_due):
            wanted = {known[0]}
        else:
            wanted = {"plain", "input-major", "screen"} if screen_due else {"plain", "input-major"}
        candidates = self._candidates(copies, wanted)
        if len(wanted) == 1:
            self.way = next(iter(wanted)) if wanted <= set(candidates) else "plain"
        else:
            self.way = self._fastest(candidates, features)
            CHOICES[key] = (self.way, "screen" in candidates)
        self._keep(copies)

    def _candidates(self, copies: _Copies, wanted: set) -> dict:
        """way -> a callable of the features, for plain and each wanted way that applies here."""
        ways = {"plain": lambda h: F.linear(h, self.weight, self.bias).argmax(-1)}
        if "input-major" in wanted and self.weight.numel() * self.weight.element_size() <= MAX_COPY_BYTES:
            if copies.input_major is None:
                copies.input_major = self.weight.detach().t().contiguous()  # (E, V)
            self.copy = copies.input_major
            ways["input-major"] = lambda h: (h @ self.copy).argmax(-1)
        if "screen" in wanted and self.greedy:
            if copies.screen is None:
                copies.screen = ScreenTable(self.weight, self.bias, copies.key)
            if copies.screen.usable:
                self.screen = GreedyScreen(copies.screen, self.weight, self.bias)
                ways["screen"] = self.screen
        return ways

    def _fastest(self, candidates: dict, features: torch.Tensor) -> str:
        """The candidate with the least median time on these features."""
        if len(candidates) == 1:
            return "plain"
        times = {way: median_seconds(lambda: fn(features)) for way, fn in candidates.items()}
        return min(times, key=times.get)

    def _keep(self, copies: _Copies) -> None:
        """Drop the copies the chosen way does not read: a copy the size of the weight is not kept idle."""
        if self.way != "input-major":
            copies.input_major, self.copy = None, None
        if self.way != "screen" and self.mode == "auto":
            copies.screen, self.screen = None, None
