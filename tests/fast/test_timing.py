"""fast/timing: alternating rounds, the work run between timed calls, the caches emptied for decoding's
kernel choices."""
import time

import torch

from lmforge.fast import int8, timing


def test_between_runs_before_every_timed_call_and_is_not_timed():
    order = []
    calls = {"a": lambda: order.append("a"), "b": lambda: order.append("b")}

    def between():
        order.append("-")
        time.sleep(0.02)

    times = timing.alternating(calls, rounds=3, between=between)
    assert order == ["a", "b"] + ["-", "a", "-", "b"] * 3  # warm-ups first, then each call after one
    assert max(times.values()) < 0.01  # the 20 ms between calls is in no call's time


def test_the_last_level_cache_is_read_or_a_fallback_given():
    size = timing.last_level_cache_bytes()
    assert size >= 256 << 10 and size % 1024 == 0  # at least an L2's kilobytes
    empty = timing.cold_caches()
    assert empty() == 1.0  # it reads the whole block


def test_decodings_row_counts_are_chosen_with_cold_caches_and_others_not(monkeypatch):
    emptied = []
    monkeypatch.setattr(int8, "cold_caches", lambda: lambda: emptied.append(1))
    layer = int8.Int8Linear.from_linear(torch.nn.Linear(64, 48), "weight-only").eval()
    for rows, cold in ((1, True), (8, True), (40, False)):
        emptied.clear()
        key = ("weight-only", 64, 48, int8.bucket_of(rows), torch.get_num_threads())
        with torch.no_grad():
            layer._measure(key, torch.randn(rows, 64))
        assert (len(emptied) == 5 * len(int8.TIMINGS[key])) == cold and (not emptied) == (not cold)
