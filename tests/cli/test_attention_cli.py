"""`lmforge attention` end to end on tiny saved models: the page (self-contained, the pair's tokens
in their own segment, cross attention for an encoder-decoder), PNG and SVG figures; bad input gives
one line naming the option and exit status 2."""
import json
import re
import xml.etree.ElementTree as ET

import pytest
import torch
from matplotlib.image import imread

import lmforge
from lmforge.cli import main
from lmforge.tokenizer import train_tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

TEXTS = [f"the {a} {b} sat on the {c}" for a in ("small", "red", "old") for b in ("cat", "dog", "fox")
         for c in ("mat", "hill")]
TEXT, PAIR = "the red fox sat on the mat", "the old dog sat"


def saved(path, preset: str, kind: str, family: str) -> str:
    """A tiny random model of `preset` with a tokenizer trained on TEXTS, saved to `path`."""
    tok = train_tokenizer(TEXTS, kind, 120, family=family)
    torch.manual_seed(0)
    lmforge.build(lmforge.tiny(preset, vocab_size=tok.vocab_size, max_seq_len=64)).save(path)
    tok.save(path)
    return str(path)


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    """A tiny BERT directory."""
    return saved(tmp_path_factory.mktemp("bert"), "bert-base", "wordpiece", "bert")


def page_meta(path) -> dict:
    """The page's embedded description (tokens, layers, heads, segments, notes)."""
    text = path.read_text(encoding="utf-8")
    assert "http://" not in text and "https://" not in text and not re.search(r"\b(src|href)\s*=", text)
    return json.loads(re.search(r'<script type="application/json" id="lmf-meta">(.*?)</script>', text,
                                re.S)[1])


def test_attention_writes_the_page_and_figures(bert, tmp_path, capsys):
    # a folder that does not exist yet is made, as every command's atomic writes do (utils/atomic.py)
    out, png, svg = tmp_path / "new" / "dir" / "view.html", tmp_path / "f.png", tmp_path / "f.svg"
    assert main(["attention", "--model", bert, TEXT, "--pair", PAIR, "--out", str(out), "--png", str(png),
                 "--svg", str(svg), "--layer", "1", "--heads", "0,2"]) == 0
    meta = page_meta(out)
    assert meta["title"] == bert  # the model named, not its preset's paper
    (group,) = meta["groups"]
    assert group["name"] == "self" and group["layers"] == [0, 1] and group["heads"] == [4, 4]
    words = [t for t in group["rows"] if not t.startswith("[")]
    assert "".join(words).replace("#", "") == (TEXT + PAIR).replace(" ", "")  # the text, then the pair
    first_sep = group["rows"].index("[SEP]")
    assert meta["segments"] == [0] * (first_sep + 1) + [1] * (len(group["rows"]) - first_sep - 1)
    assert imread(png).std() > 0.05  # drawn, not blank
    assert ET.parse(svg).getroot().tag.endswith("svg")
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith(f"wrote {out} (0.0") and printed[1:] == [f"wrote {png}", f"wrote {svg}"]


def test_an_encoder_decoder_shows_its_three_attentions(tmp_path):
    t5 = saved(tmp_path / "t5", "t5-small", "unigram", "t5")
    out = tmp_path / "view.html"
    assert main(["attention", "--model", t5, TEXT, "--pair", PAIR, "--layers", "1", "--out", str(out)]) == 0
    groups = {G["name"]: G for G in page_meta(out)["groups"]}
    assert list(groups) == ["encoder", "decoder", "cross"] and \
        all(G["layers"] == [1] for G in groups.values())
    assert groups["cross"]["rows"] == groups["decoder"]["rows"] and \
        groups["cross"]["cols"] == groups["encoder"]["cols"]
    assert len(groups["cross"]["rows"]) != len(groups["cross"]["cols"])  # the pair is the decoder's input


@pytest.mark.parametrize("argv, message", [
    ([TEXT], "give --out view.html and/or --png / --svg"),
    (["", "--out", "v.html"], "the text to show attention for is empty"),
    ([TEXT, "--pair", " ", "--out", "v.html"], "error: --pair is empty: give the second text"),  # the flag
    # --layers is read as the server reads ?layers= (analysis.attention.layer_list)
    ([TEXT, "--out", "v.html", "--layers", "0,7"], "--layers '0,7': 7 is not a layer of this model (0..1)"),
    ([TEXT, "--out", "v.html", "--layers", "1-0"], "--layers '1-0': the range 1-0 runs backwards"),
    ([TEXT, "--out", "v.html", "--layers", "\uff11"], "--layers '\uff11': expected indices"),  # a fullwidth 1
    ([TEXT, "--out", "v.html", "--layers", ","], "--layers ',' names no layer"),
    # a range past any model's layers was built first: 0-100000000 filled the memory
    ([TEXT, "--out", "v.html", "--layers", "0-100000000"], "--layers '0-100000000': 100000000 is not"),
    ([TEXT, "--png", "f.jpg"], "--png f.jpg: the figure's file must end in .png"),
    ([TEXT, "--out", "v.html", "--png", "f.svg"], "--png f.svg: the figure's file must end in .png"),
    ([TEXT, "--png", "f.png", "--layer", "9"], "--layer 9: group 'self' has layers [0, 1]"),
    ([TEXT, "--out", "v.html", "--png", "f.png", "--layer", "9"], "--layer 9: group"),  # before the HTML
    ([TEXT, "--out", "v.html", "--layer", "1"], "--layer: they choose what a figure draws; give --png"),
    ([TEXT, "--png", "f.png", "--heads", "0,9"], "--heads [0, 9]: pick one or more of 0..3"),
    ([TEXT, "--png", "f.png", "--heads", "a"], "--heads 'a': expected head indices"),
    ([TEXT, "--png", "f.png", "--heads", "1,1"], "--heads [1, 1]: a head is named twice"),
    ([TEXT, "--svg", "f.svg", "--group", "cross"], "--group 'cross': have ['self']"),
    # one file for the page and a figure: the figure silently replaced the page
    # the page's file must be HTML (view.png held a page, exit 0), so it is never a figure's too
    ([TEXT, "--out", "f.png", "--png", "./f.png"], "--out f.png: the page is HTML, its file must end in"),
    ([TEXT, "--out", "f.svg", "--svg", "f.svg"], "--out f.svg: the page is HTML, its file must end in"),
])
def test_bad_input_is_one_line_and_status_2(bert, tmp_path, capsys, monkeypatch, argv, message):
    monkeypatch.chdir(tmp_path)
    assert main(["attention", "--model", bert, *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("lmforge attention: error: ") and err.count("\n") == 1 and message in err, err
    assert not [p for p in tmp_path.iterdir() if p.suffix in (".html", ".png", ".svg", ".jpg")]


def test_the_figure_draws_the_first_recorded_layer_by_default(bert, tmp_path, capsys):
    png = tmp_path / "f.png"  # --layers 1 records layer 1 only: a default --layer 0 was refused
    assert main(["attention", "--model", bert, TEXT, "--layers", "1", "--png", str(png)]) == 0
    assert imread(png).std() > 0.05 and capsys.readouterr().out.splitlines() == [f"wrote {png}"]


def test_a_missing_model_is_named(tmp_path, capsys):
    assert main(["attention", "--model", str(tmp_path / "none"), TEXT,
                 "--out", str(tmp_path / "v.html")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--model" in err and str(tmp_path / "none") in err


def test_a_text_cut_at_max_seq_len_is_said_on_stderr_and_in_the_page(bert, tmp_path, capsys):
    out = tmp_path / "view.html"
    long_text = " ".join([TEXT] * 20)  # well over the model's 64 tokens
    assert main(["attention", "--model", bert, long_text, "--out", str(out)]) == 0
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "cut to the model's max_seq_len: 64 of its" in err, err
    meta = page_meta(out)
    assert meta["meta"]["truncated"] == "True" and meta["meta"]["tokens_kept"] == "64"
    assert int(meta["meta"]["tokens_total"]) > 64 and any("64 of its" in note for note in meta["notes"])
    assert len(meta["groups"][0]["rows"]) == 64
    assert main(["attention", "--model", bert, TEXT, "--out", str(out)]) == 0  # a short text: no note
    assert capsys.readouterr().err == "" and "truncated" not in page_meta(out)["meta"]
