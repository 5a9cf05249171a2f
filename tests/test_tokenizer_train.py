"""lmforge.train_tokenizer, word_starts and `lmforge tokenizer train`.

Every tokenizer is trained here on a few hundred sentences of the built-in corpus;
transformers reads the saved directories as the reference.
"""
import re
from itertools import pairwise
from pathlib import Path

import pytest
import torch

import lmforge
from lmforge.cli import main
from lmforge.data import corpus_text
from lmforge.tokenizer import TokenizerError, train_tokenizer, word_starts
from lmforge.tokenizer.train import FAMILIES

CORPUS = [line for line in corpus_text(150, seed=0).splitlines() if line.strip()]
HELD_OUT = [line for line in corpus_text(8, seed=1).splitlines() if line.strip()]
SIZES = {"wordpiece": 300, "bpe": 300, "bytelevel-bpe": 400, "unigram": 300}
KINDS = tuple(SIZES)
# the default family of each kind, and its special tokens in id order
DEFAULTS = {"wordpiece": "bert", "bpe": "bert", "bytelevel-bpe": "roberta", "unigram": "t5"}
SPECIALS = {"bert": ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"],
            "roberta": ["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
            "gpt2": ["<|endoftext|>"], "t5": ["<pad>", "</s>", "<unk>"]}
PAIR = (HELD_OUT[0], HELD_OUT[1])


@pytest.fixture(scope="module")
def trained():
    """kind (or kind/family) -> a tokenizer trained on CORPUS."""
    out = {kind: train_tokenizer(CORPUS, kind, size) for kind, size in SIZES.items()}
    out["bytelevel-bpe/gpt2"] = train_tokenizer(CORPUS, "bytelevel-bpe", 400, family="gpt2")
    return out


@pytest.mark.parametrize("kind", KINDS)
def test_special_tokens_take_the_first_ids_and_the_template(trained, kind):
    tok, family = trained[kind], DEFAULTS[kind]
    assert [tok.id_to_token(i) for i in range(len(SPECIALS[family]))] == SPECIALS[family]
    assert tok.special_tokens == FAMILIES[family].roles
    a, b = (tok.encode(t, add_special_tokens=False).ids for t in PAIR)
    pair = tok.encode(*PAIR)
    if family == "bert":
        assert pair.ids == [tok.cls_id, *a, tok.sep_id, *b, tok.sep_id]
        assert pair.segment_ids == [0] * (len(a) + 2) + [1] * (len(b) + 1)
    elif family == "roberta":
        assert pair.ids == [0, *a, 2, 2, *b, 2] and set(pair.segment_ids) == {0}
        assert (tok.cls_id, tok.pad_id, tok.sep_id, tok.unk_id, tok.mask_id) == (0, 1, 2, 3, 4)
    else:  # t5: A </s> B </s>; 100 sentinels above the trained vocabulary, <extra_id_0> the highest
        assert pair.ids == [*a, tok.eos_id, *b, tok.eos_id] and tok.encode("").ids == [tok.eos_id]
        assert len(tok) == SIZES[kind] + 100
        assert tok.token_to_id("<extra_id_0>") == len(tok) - 1
        assert tok.token_to_id("<extra_id_99>") == SIZES[kind]
    if kind != "unigram":
        assert len(tok) == SIZES[kind]


def test_gpt2_family_has_no_template(trained):
    tok = trained["bytelevel-bpe/gpt2"]
    text = HELD_OUT[0]
    assert tok.encode(text).ids == tok.encode(text, add_special_tokens=False).ids
    assert tok.bos_id == tok.eos_id == tok.unk_id == tok.token_to_id("<|endoftext|>") == 0
    assert tok.encode("a<|endoftext|>b").ids[1] == 0


def reference_ids(reference, *texts):
    out = reference(*texts, return_token_type_ids=True)
    return out["input_ids"], out["token_type_ids"]


@pytest.mark.parametrize("kind", [*KINDS, "bytelevel-bpe/gpt2"])
def test_transformers_loads_the_saved_tokenizer_with_the_same_ids(trained, kind, tmp_path):
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    tok = trained[kind]
    tok.save(tmp_path)
    specials = " ".join(SPECIALS["bert" if kind in ("wordpiece", "bpe") else DEFAULTS.get(kind, "gpt2")])
    texts = [*HELD_OUT[:6], "", "  spaced   out  ", f"{specials} and <mask> [MASK] <extra_id_0> inside",
             "Unseen wörds, ÇA VA? 😀"]
    for reference in (AutoTokenizer.from_pretrained(tmp_path),
                      PreTrainedTokenizerFast.from_pretrained(tmp_path)):
        assert len(reference) == len(tok)
        for role in ("pad", "unk", "cls", "sep", "mask", "bos", "eos"):
            assert getattr(reference, f"{role}_token_id") == tok.special_id(role), role
        for text in texts:
            enc = tok.encode(text)
            assert (enc.ids, enc.segment_ids) == reference_ids(reference, text), text
        enc = tok.encode(*PAIR)
        assert (enc.ids, enc.segment_ids) == reference_ids(reference, *PAIR)
    back = lmforge.load_tokenizer(tmp_path)
    assert back.special_tokens == tok.special_tokens
    assert all(back.encode(t).ids == tok.encode(t).ids for t in texts)


def test_round_trips(trained):
    lines = HELD_OUT + ["  spaced   out  ", "\n".join(HELD_OUT[:3])]
    byte_level = trained["bytelevel-bpe"]
    for text in lines + ["Unseen wörds, ÇA VA? 😀\ttab"]:  # byte-level BPE is lossless, any text
        assert byte_level.decode(byte_level.encode(text).ids) == text
    unigram = trained["unigram"]
    for text in HELD_OUT + ["spaced   out  "]:  # every character was seen in training (a line break was not)
        assert unigram.decode(unigram.encode(text).ids) == text
    # Metaspace prepends "▁" only to a text not starting with a space, and decoding drops one
    assert unigram.decode(unigram.encode("  spaced").ids) == " spaced"
    wordpiece, bpe = trained["wordpiece"], trained["bpe"]
    for text in HELD_OUT:
        # WordPiece's decoder glues "." and "," back onto the word before; whitespace is collapsed
        assert wordpiece.decode(wordpiece.encode(text).ids) == " ".join(text.split())
        # plain BPE ends every word (punctuation included) with a space
        assert bpe.decode(bpe.encode(text).ids) == " ".join(re.findall(r"\w+|[^\w\s]+", text))
    assert wordpiece.decode(wordpiece.encode("end . Next , word").ids) == "end. Next, word"


def test_normaliser_lowercases_and_strips_accents_only_when_asked():
    corpus = CORPUS + ["Héllo Wörld, naïve café!"] * 3
    plain = train_tokenizer(corpus, "bytelevel-bpe", 400)
    assert plain.backend.normalizer is None
    text = "Héllo Wörld"
    lower = train_tokenizer(corpus, "bytelevel-bpe", 400, lowercase=True)
    assert lower.decode(lower.encode(text).ids) == "héllo wörld"
    both = train_tokenizer(corpus, "wordpiece", 300, lowercase=True, strip_accents=True)
    assert both.decode(both.encode(text).ids) == "hello world"
    assert both.encode("CAFÉ").ids == both.encode("cafe").ids and both.token_to_id("[MASK]") == 4
    accents = train_tokenizer(corpus, "unigram", 300, strip_accents=True)
    assert accents.decode(accents.encode("naïve Nacé").ids) == "naive Nace"


def words_by_starts(tok, ids):
    """The decoded words of `ids` as word_starts groups them (whitespace-only groups dropped)."""
    starts = word_starts(tok, ids)
    cuts = [i for i, s in enumerate(starts) if s] + [len(ids)]
    words = [tok.decode(ids[a:b]).strip() for a, b in pairwise(cuts)]
    return [w for w in words if w]


@pytest.mark.parametrize("kind", KINDS)
def test_word_starts(trained, kind):
    tok = trained[kind]
    text = "\n".join(HELD_OUT[:4]) if kind == "bytelevel-bpe" else " ".join(HELD_OUT[:4])
    ids = tok.encode(text).ids
    starts = tok.word_starts(ids)
    assert len(starts) == len(ids) and starts == word_starts(tok, torch.tensor(ids))
    specials = set(tok.backend.get_added_tokens_decoder())
    assert all(s for i, s in zip(ids, starts) if i in specials)  # special tokens are words
    assert not all(starts)  # the corpus has words of several pieces
    if kind in ("bytelevel-bpe", "unigram"):  # words as spaces (and line breaks) separate them
        assert words_by_starts(tok, ids) == text.split()
    else:  # words as the pre-tokenizer splits them: punctuation apart
        pieces = [w for w, _ in tok.backend.pre_tokenizer.pre_tokenize_str(text)]
        assert words_by_starts(tok, ids) == pieces
    pair = tok.encode(*PAIR).ids  # the first word of B starts after </s></s> (no leading space in RoBERTa)
    assert words_by_starts(tok, pair) == words_by_starts(tok, tok.encode(PAIR[0]).ids) + \
        words_by_starts(tok, tok.encode(PAIR[1]).ids)


def ids_of(tok, pieces):
    ids = [tok.token_to_id(p) for p in pieces]
    assert None not in ids
    return ids


def test_word_starts_golden(trained):
    wp = trained["wordpiece"]
    ids = ids_of(wp, ["[CLS]", "##e", "h", "##e", "##r", ".", "[MASK]", "##s", "[SEP]"])
    assert wp.word_starts(ids) == [True, True, True, False, False, True, True, True, True]
    bpe = trained["bpe"]
    ids = ids_of(bpe, ["h", "e", "r</w>", ".</w>", "a</w>", "[UNK]", "e", "[SEP]"])
    assert bpe.word_starts(ids) == [True, False, False, True, True, True, True, True]
    bl = trained["bytelevel-bpe"]  # no leading space first and after <s>; a line break ends a word
    ids = ids_of(bl, ["h", "e", "Ġ", "h", "e", ".", "Ċ", "N", "<s>", "a", "Ġa", "Ġ", "Ġ", "a"])
    assert bl.word_starts(ids) == [True, False, True, False, False, False, True, True, True, True, True, True,
                                   True, False]
    uni = trained["unigram"]
    ids = ids_of(uni, ["e", "\u2581", "e", "\u2581B", "e", "</s>", "e", "<extra_id_3>"])
    assert uni.word_starts(ids) == [True, True, False, True, False, True, True, True]


def test_training_from_files_equals_training_from_texts(tmp_path):
    half = len(CORPUS) // 2
    files = [tmp_path / "a.txt", tmp_path / "b.txt"]
    for file, lines in zip(files, (CORPUS[:half], CORPUS[half:])):
        file.write_text("\n".join(lines) + "\n", encoding="utf-8")
    # byte-level BPE trains reproducibly (its alphabet is fixed: see the train module's docstring)
    from_texts = train_tokenizer(CORPUS, "bytelevel-bpe", 400)
    for source in (files, [str(f) for f in files]):
        assert train_tokenizer(source, "bytelevel-bpe", 400).backend.to_str() == from_texts.backend.to_str()
    assert len(train_tokenizer(str(files[0]), "unigram", 200)) == 300


def test_training_from_jsonl_and_gzip_equals_training_from_their_texts(tmp_path):
    import gzip
    import json

    from_texts = train_tokenizer(CORPUS, "bytelevel-bpe", 400)
    records = [json.dumps({"id": i, "text": line}) for i, line in enumerate(CORPUS)]
    jsonl, packed = tmp_path / "a.jsonl", tmp_path / "b.txt.gz"
    jsonl.write_text("\n".join(records[:10]) + "\n", encoding="utf-8")
    packed.write_bytes(gzip.compress(("\n\n".join(CORPUS[10:]) + "\n").encode()))
    assert train_tokenizer([jsonl, packed], "bytelevel-bpe", 400).backend.to_str() == \
        from_texts.backend.to_str()
    (tmp_path / "empty.jsonl").write_text(json.dumps({"title": "no text field"}) + "\n")
    with pytest.warns(UserWarning), pytest.raises(TokenizerError, match="empty corpus"):
        train_tokenizer([tmp_path / "empty.jsonl"], "wordpiece", 300)


def test_bad_input(tmp_path):
    with pytest.raises(ValueError, match="kind='sentencepiece' is not one of wordpiece, bpe"):
        train_tokenizer(CORPUS, "sentencepiece", 300)
    with pytest.raises(ValueError, match="family='xlnet' is not one of bert"):
        train_tokenizer(CORPUS, "bpe", 300, family="xlnet")
    with pytest.raises(ValueError, match="vocab_size must be an integer >= 261 for bytelevel-bpe"):
        train_tokenizer(CORPUS, "bytelevel-bpe", 200)
    with pytest.raises(ValueError, match="vocab_size must be an integer >= 6"):
        train_tokenizer(CORPUS, "wordpiece", 5)
    with pytest.raises(ValueError, match="and <= 4194304, got 10000000000"):  # was a Rust panic: an abort
        train_tokenizer(CORPUS, "bpe", 10 ** 10)
    with pytest.raises(ValueError, match="min_frequency"):
        train_tokenizer(CORPUS, "bpe", 300, min_frequency=0)
    with pytest.raises(ValueError, match="<= 1000000000, got 100000000000000000000"):  # was an OverflowError
        train_tokenizer(CORPUS, "wordpiece", 300, min_frequency=10 ** 20)
    with pytest.raises(ValueError, match="unigram merges none"):  # not silently ignored
        train_tokenizer(CORPUS, "unigram", 300, min_frequency=5)
    for empty in ([], ["", "  \n"], iter([])):
        with pytest.raises(TokenizerError, match="empty corpus"):
            train_tokenizer(empty, "wordpiece", 300)
    (tmp_path / "empty.txt").write_text("\n\n")
    with pytest.raises(TokenizerError, match="empty corpus"):
        train_tokenizer([tmp_path / "empty.txt"], "bpe", 300)
    with pytest.raises(FileNotFoundError, match="no such file: .*missing.txt"):
        train_tokenizer([tmp_path / "empty.txt", tmp_path / "missing.txt"], "bpe", 300)
    (tmp_path / "latin1.txt").write_bytes("café\n".encode("latin-1"))
    with pytest.raises(TokenizerError, match="not UTF-8"):
        train_tokenizer([tmp_path / "latin1.txt"], "bpe", 300)
    with pytest.raises(TokenizerError, match="source: corpus texts must be str, got int"):
        train_tokenizer(["fine", 3], "unigram", 300)
    for source in (None, 3, b"bytes iterate as numbers", {"a dict": "iterates as its keys"}):
        with pytest.raises(TokenizerError, match="source: a file, a list of files or an iterable of texts"):
            train_tokenizer(source, "unigram", 300)


def test_a_file_name_is_never_trained_on_as_a_text_and_a_folder_is_its_files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "texts").mkdir()
    (tmp_path / "texts" / "a.txt").write_text("\n".join(CORPUS[:40]) + "\n")
    with pytest.raises(FileNotFoundError, match="no such file: missing.txt"):  # was a corpus of 11 characters
        train_tokenizer("missing.txt", "bpe", 300)
    with pytest.raises(FileNotFoundError, match="'mising.txt', while texts/a.txt is one"):
        train_tokenizer(["texts/a.txt", "mising.txt"], "bpe", 300)
    whole = train_tokenizer([tmp_path / "texts" / "a.txt"], "bpe", 300).backend.to_str()
    assert train_tokenizer("texts", "bpe", 300).backend.to_str() == whole  # was "texts is not a file"
    small = train_tokenizer(["the texts", "."], "bpe", 300)  # texts: "." names a folder, no file
    assert small.vocab_size < 300 and small.decode(small.encode("the texts").ids) == "the texts"


@pytest.mark.parametrize("kind", ["bpe", "wordpiece"])
def test_more_ids_than_vocab_size_is_said_never_silent(kind):
    """BPE and WordPiece keep every character whatever vocab_size asks: 10 gave 90 or 94 ids, unsaid."""
    import warnings

    from lmforge.data.corpus import CorpusWarning

    with pytest.warns(CorpusWarning, match=r"^vocab_size=10: the corpus's characters alone make (\d+) ids"):
        made = train_tokenizer(CORPUS, kind, 10).vocab_size
    assert made > 10
    with warnings.catch_warnings():
        warnings.simplefilter("error", CorpusWarning)  # none where the size asked holds the characters
        assert train_tokenizer(CORPUS, kind, made + 20).vocab_size <= made + 20


@pytest.mark.parametrize("kind", ["bpe", "unigram"])
def test_a_file_not_utf8_past_its_first_block_is_named_with_the_place(tmp_path, kind):
    """The Rust reader's "stream did not contain valid UTF-8" named no file: the bad byte lay beyond the
    first buffer of a file, which is all the empty-corpus check reads."""
    good, bad = tmp_path / "good.txt", tmp_path / "bad.txt"
    good.write_text("\n".join(CORPUS) + "\n", encoding="utf-8")
    bad.write_bytes(b"good line here\n" * 2000 + b"hello \xff\xfe world\n")
    with pytest.raises(TokenizerError, match=f"^{bad} is not UTF-8 text: .* in position 30006"):
        train_tokenizer([good, bad], kind, 300)


def test_cli_trains_on_files_and_on_the_built_in_corpus(tmp_path, capsys):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(CORPUS) + "\n", encoding="utf-8")
    out = tmp_path / "wp"
    assert main(["tokenizer", "train", "--kind", "wordpiece", "--vocab-size", "300", "--lowercase",
                 "--out", str(out), str(corpus)]) == 0
    assert "wordpiece, 300 ids, 1 file(s)" in capsys.readouterr().out
    tok = lmforge.load_tokenizer(out)
    assert tok.tokenize("He works") == ["[CLS]", "he", "works", "[SEP]"]
    assert main(["tokenizer", "train", "--kind", "unigram", "--vocab-size", "250", "--family", "bert",
                 "--docs", "100", "--out", str(tmp_path / "uni")]) == 0
    assert "built-in corpus, 100 documents" in capsys.readouterr().out
    tok = lmforge.load_tokenizer(tmp_path / "uni")
    assert len(tok) == 250 and tok.encode("a", "b").ids[0] == tok.cls_id == 2


@pytest.mark.parametrize("argv, message", [
    (["--kind", "bpe", "--vocab-size", "300", "missing.txt"], "no such file: "),
    (["--kind", "bpe", "--vocab-size", "300", "EMPTY"], "empty corpus"),
    (["--kind", "bpe", "--vocab-size", "300", "--docs", "0"], "--docs 0: must be in [1, 1000000]"),
    (["--kind", "bpe", "--vocab-size", "300", "--docs", "10" * 6], "--docs 101010101010: must be"),  # a hang
    (["--kind", "bytelevel-bpe", "--vocab-size", "100"], "--vocab-size 100: must be an integer >= 261"),
    (["--kind", "bpe", "--vocab-size", "300", "--min-frequency", "1" + "0" * 20],
     "--min-frequency 100000000000000000000: must be in [1, 1000000000]"),  # was an OverflowError's traceback
    (["--kind", "unigram", "--vocab-size", "300", "--min-frequency", "2"],
     "--min-frequency 2: it counts the pairs"),  # was ignored
    (["--kind", "bpe", "--vocab-size", "300", "--docs", "50", "EMPTY"],
     "--docs: it draws the built-in corpus, and FILES are read instead"),  # was ignored
    (["--kind", "bpe", "--vocab-size", "300", "--seed", "3", "EMPTY"], "--seed: it draws the built-in"),
])
def test_cli_bad_input_exits_2_with_one_line(tmp_path, capsys, argv, message):
    (tmp_path / "EMPTY").write_text("")
    argv = [str(tmp_path / a) if a in ("missing.txt", "EMPTY") else a for a in argv]
    try:
        status = main(["tokenizer", "train", *argv, "--out", str(tmp_path / "out")])
    except SystemExit as refused:  # argparse's own refusals (a flag's bounds)
        status = refused.code
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1 and message in err and err.startswith("lmforge tokenizer")
    assert not Path(tmp_path / "out").exists()


@pytest.mark.parametrize("kind", ["wordpiece", "unigram"])
def test_a_plain_file_is_cleaned_as_corpus_shard_cleans_it(tmp_path, kind):
    """The Rust reader took a BOM, CRs and NULs into the vocabulary (unigram's "\\r" piece), ids that
    `corpus shard` never writes: it strips them (tabs made spaces; a CRLF or a lone CR ends a line)."""
    from lmforge.data.corpus import CorpusWarning

    clean, dirty = tmp_path / "clean.txt", tmp_path / "dirty.txt"
    clean.write_text("\n".join(CORPUS) + "\n", encoding="utf-8")
    dirty.write_bytes(b"\xef\xbb\xbf" + "\r\n".join(CORPUS).replace(" ", " \x00", 3).encode() + b"\r\n")
    with pytest.warns(CorpusWarning, match=f"^{dirty}: 4 control character"):
        made = train_tokenizer([dirty], kind, 300)
    vocab = made.backend.get_vocab()
    assert not [t for t in vocab if any(c in t for c in "\ufeff\r\x00")]
    assert vocab == train_tokenizer([clean], kind, 300).backend.get_vocab()
    old_mac = tmp_path / "old_mac.txt"  # lone CRs: lines as the corpus reader ends them, not spaces
    old_mac.write_bytes(b"\xef\xbb\xbf" + "\r".join(CORPUS).encode() + b"\r")
    with pytest.warns(CorpusWarning):
        assert train_tokenizer([old_mac], kind, 300).backend.get_vocab() == vocab
