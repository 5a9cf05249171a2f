"""A trained tokenizer depends on its text alone: the same text gives the same tokenizer.json in
every process (huggingface/tokenizers#1794), and the canonical renumbering keeps the encoding."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lmforge.data import corpus_text
from lmforge.tokenizer import train_tokenizer
from lmforge.tokenizer.canonical import base_pieces, canonical, canonical_pieces, renumbered
from lmforge.tokenizer.train import FAMILIES, backend_and_trainer

CORPUS = [line for line in corpus_text(150, seed=0).splitlines() if line.strip()]
HELD_OUT = [line for line in corpus_text(8, seed=1).splitlines() if line.strip()]
SIZES = {"wordpiece": 300, "bpe": 300, "bytelevel-bpe": 400, "unigram": 300}
DEFAULTS = {"wordpiece": "bert", "bpe": "bert", "bytelevel-bpe": "roberta", "unigram": "t5"}
def train_all(out) -> None:
    """Every kind trained on the built-in corpus (a large vocabulary too: its cut-off ties), each saved
    under `out`/kind."""
    texts = [line for line in corpus_text(150, seed=0).splitlines() if line.strip()]
    more = corpus_text(400, seed=2).splitlines()
    for kind, size in SIZES.items():
        train_tokenizer(texts, kind, size).save(f"{out}/{kind}")
        train_tokenizer(more, kind, 1500, lowercase=True).save(f"{out}/{kind}-big")


@pytest.mark.slow  # a process start each; the suite's fast half keeps the property's other tests
def test_two_processes_train_the_same_tokenizer_json(tmp_path):
    # the other process has another hash seed (Python's own hashing differs between the processes too);
    # it trains while this one does (one process start instead of two)
    seed = "2" if os.environ.get("PYTHONHASHSEED") == "1" else "1"
    code = "import sys; from tests.tokenizer.test_reproducible import train_all; train_all(sys.argv[1])"
    other = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "other")],
                             cwd=Path(__file__).parents[2], env={**os.environ, "PYTHONHASHSEED": seed},
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    train_all(tmp_path / "here")
    assert other.wait(timeout=300) == 0, other.stdout.read()
    for kind, size in SIZES.items():
        for name in (kind, f"{kind}-big"):
            a, b = ((tmp_path / s / name / "tokenizer.json").read_bytes() for s in ("here", "other"))
            assert a == b, name
        here = train_tokenizer(CORPUS, kind, size).backend.to_str()  # and a tokenizer never saved agrees
        assert json.loads(here) == json.loads((tmp_path / "other" / kind / "tokenizer.json").read_text())


def train_raw(kind):
    """(the trainer's own result, its canonical form, the pinned pieces) for `kind` on CORPUS."""
    spec = FAMILIES[DEFAULTS[kind]]
    pinned = []
    if kind in ("wordpiece", "bpe"):
        first, trainer = backend_and_trainer(kind, 1, spec, 2)
        first.train_from_iterator(CORPUS, trainer)
        pinned = base_pieces(first, spec.specials)
    raw, trainer = backend_and_trainer(kind, SIZES[kind], spec, 2, pinned)
    raw.train_from_iterator(CORPUS, trainer)
    return raw, canonical(raw, spec.specials, pinned), pinned


@pytest.mark.parametrize("kind", SIZES)
def test_renumbering_keeps_the_encoding(kind):
    raw, canon, pinned = train_raw(kind)
    spec = FAMILIES[DEFAULTS[kind]]
    assert canon.get_vocab().keys() == raw.get_vocab().keys() and len(canon.get_vocab()) == SIZES[kind]
    for text in [*HELD_OUT, "  spaced   out  ", "Unseen wörds, ÇA VA? 😀", "[MASK] <mask> </s>"]:
        assert canon.encode(text).tokens == raw.encode(text).tokens, text
    # the pinned pieces are special tokens of the trainer only
    added = [t.content for _, t in sorted(canon.get_added_tokens_decoder().items())]
    assert added == list(spec.specials) and (kind in ("wordpiece", "bpe")) == bool(pinned)
    # specials, then the characters by code point, then the pinned pieces, then what was learned
    order = sorted(canon.get_vocab(), key=canon.get_vocab().get)
    chars = [t for t in order if len(t) == 1]
    n = len(spec.specials)
    assert order[:n] == list(spec.specials)
    if kind != "unigram":
        assert order[n:n + len(chars)] == sorted(chars)
        assert order[n + len(chars):n + len(chars) + len(pinned)] == pinned
    if kind == "bytelevel-bpe":  # already canonical: the trainer numbers nothing in hash order
        assert json.loads(canon.to_str()) == json.loads(raw.to_str())


def test_unigram_scores_are_canonical():
    low, two = -7.25, 0.0001 + 0.0001  # the trainer adds up its penalties, then adds them to the lowest
    # the trainer gave the required characters z, b, a the penalties 0, 1, 2 (hash order)
    pieces = [["<unk>", 0.0], ["ab", -1.000000000000001], ["z", low], ["b", low + 0.0001],
              ["a", low + two], ["c", -6.5]]
    out = canonical_pieces(pieces, 1)
    assert out == [["<unk>", 0.0], ["ab", -1.0], ["c", -6.5], ["z", -7.2498], ["b", -7.2499], ["a", -7.25]]
    # another process: the penalties in another order, last-bit noise, the pieces in another order
    other = [["<unk>", 0.0], ["b", low], ["c", -6.5], ["a", low + 0.0001], ["ab", -1.0000000000000002],
             ["z", low + two]]
    assert canonical_pieces(other, 1) == out


def test_renumbered_order():
    vocab = {"[UNK]": 0, "##b": 1, "b": 2, "a": 3, "##a": 4, "ab": 5, "##ab": 6, "ba": 7}
    assert list(renumbered(vocab, ["[UNK]"], ["##a", "##b"]).items()) == [
        ("[UNK]", 0), ("a", 1), ("b", 2), ("##a", 3), ("##b", 4), ("ab", 5), ("##ab", 6), ("ba", 7)]
    with pytest.raises(AssertionError, match="special tokens first"):
        renumbered(vocab, ["[PAD]"], [])
