"""`lmforge inspect` answers any size in seconds with bounded memory, or refuses in one line."""
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lmforge.cli import main

ROOT = Path(__file__).resolve().parents[2]
# runs `inspect` in a fresh process and prints the peak memory of that process (MiB)
MEASURED = """
import resource, sys
from lmforge.cli import main
code = main(sys.argv[1:])
print("peak_mib", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024, "code", code)
"""


def test_a_hundred_million_layers_answer_in_seconds_with_bounded_memory():
    start = time.perf_counter()
    run = subprocess.run([sys.executable, "-c", MEASURED, "inspect", "bert-tiny", "n_layers=100000000",
                          "d_model=100000"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    seconds = time.perf_counter() - start
    assert run.returncode == 0, run.stderr
    peak = int(run.stdout.split("peak_mib")[1].split()[0])
    assert "layers         100000000" in run.stdout and "code 0" in run.stdout
    assert peak < 1500, f"{peak} MiB"  # torch alone is ~300 MiB; building the layers took 8 GB
    assert seconds < 120  # seconds on an idle machine; generous for a shared one


@pytest.mark.parametrize("argv, message", [
    (["bert-tiny", "--context", "-5"], "--context -5"),
    (["bert-tiny", "--context", "0"], "--context 0"),
    (["bert-tiny", "--context", "513"], "exceeds max_seq_len=512"),
    (["bert-tiny", "d_model=10000000000", "n_heads=1"], "too large to count"),
    (["bert-tiny", "attention_schedule=full"], "attention_schedule must be a list"),
])
def test_bad_values_are_one_line_errors(capsys, argv, message):
    assert main(["inspect", *argv]) == 2
    captured = capsys.readouterr()
    assert message in captured.err and captured.err.count("\n") == 1 and not captured.out


def test_a_context_within_the_model_is_counted(capsys):
    assert main(["inspect", "bert-tiny", "--context", "128"]) == 0
    assert "(context 128)" in capsys.readouterr().out
