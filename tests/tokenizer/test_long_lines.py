"""Tokenizer training on pathological lines: a long line goes to the trainer in pieces cut at
whitespace (with a warning naming the file and line), memory stays bounded, and the tokenizer
trained is the one the whole line gives."""
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import lmforge.tokenizer.lines as lines
from lmforge.cli import main
from lmforge.data import corpus_text
from lmforge.data.corpus import CorpusWarning
from lmforge.tokenizer import train_tokenizer
from lmforge.tokenizer.lines import cut, file_pieces, first_long_line

ROOT = Path(__file__).resolve().parents[2]
WORDS = " ".join(line for line in corpus_text(150, seed=0).splitlines() if line.strip())  # ~17k characters
SIZES = {"wordpiece": 300, "bpe": 300, "bytelevel-bpe": 400, "unigram": 300}


def test_cut_keeps_every_character_and_cuts_before_whitespace():
    text = "alpha beta  gamma\tdelta\nepsilon " * 50
    pieces = cut(text, 40)
    assert "".join(pieces) == text and all(0 < len(p) <= 40 for p in pieces)
    assert all(p[0] in " \t\n" for p in pieces[1:])  # each piece after the first starts at whitespace
    assert cut("x" * 100, 40) == ["x" * 40, "x" * 40, "x" * 20]  # no whitespace: cut inside the word
    assert cut("short", 40) == ["short"]


def test_first_long_line_is_found_across_blocks(tmp_path, monkeypatch):
    monkeypatch.setattr(lines, "BLOCK", 16)  # lines span many blocks
    file = tmp_path / "t.txt"
    file.write_text("a b c\n" * 5 + "y" * 30 + "\nshort\n" + "z" * 50 + "\n")
    assert first_long_line(file, 40) == 8 and first_long_line(file, 29) == 6
    assert first_long_line(file, 60) is None


def test_file_pieces_stream_a_long_line_and_keep_line_ends(tmp_path, monkeypatch):
    monkeypatch.setattr(lines, "BLOCK", 64)
    file = tmp_path / "t.txt"
    file.write_text("one\n" + WORDS[:2000] + "\nlast")
    with pytest.warns(CorpusWarning, match=rf"{file}: line 2 longer than 100 characters \(up to 2,001\)"):
        pieces = list(file_pieces(file, 100))
    assert "".join(pieces) == file.read_text() and max(map(len, pieces)) <= 100
    file.write_text("y" * 250)  # no whitespace at all: cut inside the word, and said
    with pytest.warns(CorpusWarning, match=r"line 1 longer than 100 .*2 cut\(s\) inside a word"):
        assert list(file_pieces(file, 100)) == ["y" * 100, "y" * 100, "y" * 50]


@pytest.mark.parametrize("kind", list(SIZES))
def test_a_long_line_in_pieces_trains_the_tokenizer_of_the_whole_line(tmp_path, monkeypatch, kind):
    file = tmp_path / "one.txt"
    file.write_text(WORDS + "\n" + WORDS[:500] + "\n")
    whole = train_tokenizer([file], kind, SIZES[kind]).backend.to_str()  # the Rust reader: no cut
    monkeypatch.setattr(lines, "MAX_PIECE", 300)
    with pytest.warns(CorpusWarning, match=rf"{file}: line 1 and 1 more longer than 300 characters"):
        pieces = train_tokenizer([file], kind, SIZES[kind]).backend.to_str()
    assert pieces == whole


def test_long_texts_from_memory_are_cut_too_silently_unless_inside_a_word(monkeypatch):
    monkeypatch.setattr(lines, "MAX_PIECE", 300)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # cut at whitespace only: the same tokenizer, nothing to say
        cut_up = train_tokenizer(["a short one", WORDS], "bytelevel-bpe", 400).backend.to_str()
    with pytest.warns(CorpusWarning, match=r"the texts given: text 2 longer than 300 .*1 cut\(s\) inside"):
        train_tokenizer(["a short one", "x" * 500], "bytelevel-bpe", 400)
    monkeypatch.setattr(lines, "MAX_PIECE", 1 << 16)
    assert cut_up == train_tokenizer(["a short one", WORDS], "bytelevel-bpe", 400).backend.to_str()


# trains on a 4 MB single line in a fresh process; prints the growth of its peak memory (MiB)
MEASURED = """
import random, sys, warnings
from pathlib import Path
from lmforge.tokenizer import train_tokenizer
random.seed(0)
words = [f"w{i}" for i in range(3000)] + ["the", "a", "of"] * 300
Path(sys.argv[1]).write_text(" ".join(random.choice(words) for _ in range(800_000)) + "\\n")
def peak_kib():  # VmHWM starts afresh at exec; ru_maxrss would keep the forking pytest's, hiding growth
    return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM"))
before = peak_kib()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    train_tokenizer([Path(sys.argv[1])], "wordpiece", 500)
growth = (peak_kib() - before) // 1024
print("growth_mib", growth, "warned", any("in pieces" in str(w.message) for w in caught))
"""


@pytest.mark.slow  # a 4 MB line: seconds of training
def test_a_4mb_line_trains_in_bounded_memory(tmp_path):
    run = subprocess.run([sys.executable, "-c", MEASURED, str(tmp_path / "long.txt")], cwd=ROOT,
                         capture_output=True, text=True, timeout=600,
                         env={**os.environ, "RAYON_NUM_THREADS": "2"})
    assert run.returncode == 0, run.stderr
    growth = int(run.stdout.split("growth_mib")[1].split()[0])
    assert "warned True" in run.stdout
    assert growth < 150, f"{growth} MiB"  # the whole line at once: ~400 MiB (~100 bytes a character)


def test_cli_warns_naming_the_file_and_line(tmp_path):
    file = tmp_path / "long.txt"
    file.write_text("first line\n" + (WORDS + " ") * 5 + "\n")  # ~85k characters on line 2
    with pytest.warns(CorpusWarning, match=rf"{file}: line 2 longer than 65,536 characters"):
        assert main(["tokenizer", "train", str(file), "--kind", "wordpiece", "--vocab-size", "200",
                     "--out", str(tmp_path / "tok")]) == 0
