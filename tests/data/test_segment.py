import random
import time

import pytest

from lmforge.data.segment import SentenceStream, split_sentences

GOLDEN = [
    ("Mr. Smith went to Washington. He arrived at 3.30 p.m. on Monday.",
     ["Mr. Smith went to Washington.", "He arrived at 3.30 p.m. on Monday."]),
    ("He lives in the U.S. and works for Acme Inc. in Boston.",
     ["He lives in the U.S. and works for Acme Inc. in Boston."]),
    ("She moved to the U.S. Then she left.", ["She moved to the U.S.", "Then she left."]),
    ('She said "Stop." Then she left.', ['She said "Stop."', "Then she left."]),
    ("\u201cReally?\u201d he asked. \u2018Yes.\u2019 (It was.) Fine.",
     ["\u201cReally?\u201d he asked.", "\u2018Yes.\u2019", "(It was.)", "Fine."]),
    ("Wait... what? I waited... Then he came!", ["Wait... what?", "I waited...", "Then he came!"]),
    ("The end\u2026  Next one.", ["The end\u2026", "Next one."]),
    ("See e.g. the appendix. Dr. J. R. R. Tolkien wrote it in 1937. Pi is 3.14159.",
     ["See e.g. the appendix.", "Dr. J. R. R. Tolkien wrote it in 1937.", "Pi is 3.14159."]),
    ('"Help!" she cried. Nobody came.', ['"Help!" she cried.', "Nobody came."]),
    ("1. First item. 2. Second item.", ["1. First item.", "2. Second item."]),
    ("It costs $2.50. Prices rose (a lot). Really?! Yes.",
     ["It costs $2.50.", "Prices rose (a lot).", "Really?!", "Yes."]),
    ("So did I. Then we left.", ["So did I.", "Then we left."]),
    ("See No. 5 and Fig. 2 for details. The answer was no. Then he left.",
     ["See No. 5 and Fig. 2 for details.", "The answer was no.", "Then he left."]),
    ("Prof. Ng vs. Dr. Li: a draw. St. Louis won.", ["Prof. Ng vs. Dr. Li: a draw.", "St. Louis won."]),
    # 今天很好。我们去吧！你来吗？
    ("\u4eca\u5929\u5f88\u597d\u3002\u6211\u4eec\u53bb\u5427\uff01\u4f60\u6765\u5417\uff1f",
     ["\u4eca\u5929\u5f88\u597d\u3002", "\u6211\u4eec\u53bb\u5427\uff01", "\u4f60\u6765\u5417\uff1f"]),
    ("\u5f7c\u306f\u300c\u884c\u3053\u3046\u3002\u300d\u3068\u8a00\u3063\u305f\u3002\u5e30\u3063\u305f\u3002",
     # 彼は「行こう。」と言った。帰った。: the quoted sentence stays inside its sentence
     ["\u5f7c\u306f\u300c\u884c\u3053\u3046\u3002\u300d\u3068\u8a00\u3063\u305f\u3002",
      "\u5e30\u3063\u305f\u3002"]),
    ("\u3053\u308c\u306f\u30da\u30f3\u3067\u3059\u3002 That is English.",
     ["\u3053\u308c\u306f\u30da\u30f3\u3067\u3059\u3002", "That is English."]),
    ("No terminator at all", ["No terminator at all"]),
    ("   ", []),
]


@pytest.mark.parametrize("text,sentences", GOLDEN)
def test_golden_sentences(text, sentences):
    assert split_sentences(text) == sentences


def test_stream_in_any_pieces_equals_whole_text():
    rng = random.Random(0)
    for text, sentences in GOLDEN:
        for _ in range(20):
            stream, out, i = SentenceStream(), [], 0
            while i < len(text):
                k = rng.randint(1, 6)
                out += stream.feed(text[i:i + k])
                i += k
            assert out + stream.end() == sentences


def test_run_on_text_is_cut_at_spaces_in_linear_time():
    stream = SentenceStream(max_chars=50)
    out = stream.feed("Hello there. " + "X" * 120 + " tail")
    assert out[0] == "Hello there." and all(len(s) <= 50 for s in out) and stream.cut == 2
    assert "".join(out[1:] + stream.end()).replace(" ", "") == "X" * 120 + "tail"
    # 10 MB without a sentence end, fed in small pieces: each character is scanned about once
    big, start, stream, n = "word " * 2_000_000, time.perf_counter(), SentenceStream(), 0
    for i in range(0, len(big), 4096):
        n += len(stream.feed(big[i:i + 4096]))
    assert n + len(stream.end()) == 101 and time.perf_counter() - start < 20
