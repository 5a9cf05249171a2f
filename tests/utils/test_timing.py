"""utils/timing: alternating rounds, the work run between timed calls, the caches emptied for decoding's
kernel choices, the other work seen during a measurement."""
import os
import subprocess
import sys
import time

import pytest
import torch

from lmforge.quant import int8
from lmforge.utils import timing


def test_between_runs_before_every_timed_call_and_is_not_timed():
    order = []
    calls = {"a": lambda: order.append("a"), "b": lambda: order.append("b")}

    def between():
        order.append("-")
        time.sleep(0.02)

    times = timing.alternating(calls, rounds=3, between=between)
    assert order == ["a", "b"] + ["-", "a", "-", "b"] * 3  # warm-ups first, then each call after one
    assert max(times.values()) < 0.01  # the 20 ms between calls is in no call's time


def test_self_timed_calls_report_their_own_seconds_in_alternated_rounds():
    order = []

    def call(name, seconds):
        order.append(name)
        return seconds

    times = timing.rounds_of({"a": lambda: call("a", 1.5), "b": lambda: call("b", 2.5)}, rounds=3, warmup=1,
                             zigzag=True, self_timed=True)
    assert times == {"a": [1.5] * 3, "b": [2.5] * 3}
    # warm-ups, then the order reversed every other round
    assert order == ["a", "b", "a", "b", "b", "a", "a", "b"]


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


def test_elsewhere_counts_the_other_work_on_this_process_cpus(monkeypatch):
    readings = iter([(1000, 200, 5000.0, 2), (1300, 260, 5200.0, 2)])  # busy, own, clock ticks, CPUs
    monkeypatch.setattr(timing, "_ticks", lambda: next(readings))
    with timing.Elsewhere() as other:
        pass
    assert other.ticks == 240 and other.share == 240 / 400 and other.busy  # 300 busy, 60 of them ours
    readings = iter([(1000, 200, 5000.0, 2), (1004, 200, 5004.0, 2)])  # a share over the bar, too few ticks
    with timing.Elsewhere() as other:
        pass
    assert other.share > timing.BUSY_SHARE and not other.busy
    readings = iter([(1000, 200, 5000.0, 2), (1010, 200, 5010.0, 2)])  # 10 ticks of 20 in 0.1 s: a neighbour
    with timing.Elsewhere() as other:
        pass
    assert other.busy
    monkeypatch.setattr(timing, "_ticks", lambda: None)  # no /proc: nothing seen
    with timing.Elsewhere() as other:
        pass
    assert other.ticks == 0 and not other.busy


@pytest.mark.slow  # a spinning neighbour process for a second
@pytest.mark.skipif(timing._ticks() is None, reason="no /proc to read CPU time from")
def test_elsewhere_sees_a_neighbour_process_spinning():
    spin = "import time\nt = time.time()\nwhile time.time() - t < 10: pass"
    neighbour = subprocess.Popen([sys.executable, "-c", spin])
    try:
        time.sleep(0.5)  # started and spinning
        with timing.Elsewhere() as other:
            time.sleep(1.0)  # this process idle: nearly all the busy ticks are the neighbour's
    finally:
        neighbour.kill()
        neighbour.wait()
    # it spun through the whole second, on one of this process's CPUs (a loaded host may give it less)
    assert other.ticks >= 0.4 * os.sysconf("SC_CLK_TCK")
