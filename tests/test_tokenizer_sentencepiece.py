"""lmforge.load_tokenizer on SentencePiece models (T5, ALBERT) against sentencepiece and transformers.

Every model is built here: trained on the spot by sentencepiece, or a ModelProto written byte by byte.
"""
import io
import json
import struct
import unicodedata

import pytest

import lmforge
from lmforge.tokenizer import TokenizerError
from tests.tokenizer_cases import CORPUS, PAIR, TEXTS, assert_same_ids


def train_spiece(path, vocab_size=60, **options):
    spm = pytest.importorskip("sentencepiece")
    buffer = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(CORPUS), model_writer=buffer, vocab_size=vocab_size,
                                   model_type="unigram", minloglevel=2, **options)
    (path / "spiece.model").write_bytes(buffer.getvalue())
    return spm.SentencePieceProcessor(model_file=str(path / "spiece.model"))


def test_t5_spiece_matches_sentencepiece_and_t5_tokenizer(tmp_path):
    sp = train_spiece(tmp_path, pad_id=0, eos_id=1, unk_id=2, bos_id=-1)
    ours = lmforge.load_tokenizer(tmp_path)
    for text in TEXTS + ["full width ＡＢＣ", "x" * 300]:  # SentencePiece itself, T5's </s> appended
        assert ours.encode(text).ids == sp.encode(text) + [1], text
    assert ours.encode("").ids == [ours.eos_id] == [1] and ours.pad_id == 0 and ours.unk_id == 2
    assert ours.decode(ours.encode(TEXTS[0]).ids) == sp.decode(sp.encode(TEXTS[0]))
    pytest.importorskip("google.protobuf")  # transformers reads spiece.model through protobuf
    from transformers import T5Tokenizer

    reference = T5Tokenizer.from_pretrained(tmp_path)
    assert_same_ids(ours, reference, TEXTS + ["The </s> fox <extra_id_0>"])
    assert ours.vocab_size == len(reference) == 160  # 100 sentinels, <extra_id_0> the highest id
    assert ours.token_to_id("<extra_id_0>") == reference.convert_tokens_to_ids("<extra_id_0>") == 159


@pytest.mark.parametrize("options", [{"remove_extra_whitespaces": False},
                                     {"normalization_rule_name": "identity"},
                                     {"user_defined_symbols": ["@@", "<sep>"]}])
def test_spiece_spaces_and_user_symbols_match_sentencepiece(tmp_path, options):
    """Only U+0020 is SentencePiece's space; its dummy prefix is always added, never after a user symbol."""
    sp = train_spiece(tmp_path, pad_id=0, eos_id=1, unk_id=2, bos_id=-1, hard_vocab_limit=False, **options)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"extra_ids": 0}))
    ours = lmforge.load_tokenizer(tmp_path)
    for text in ["  two leading, two trailing  ", "a\tb", "\u00a0no-break", "x\ny", "a\u3000b", " ",
                 "a@@b<sep>c"]:
        assert ours.encode(text).ids == sp.encode(text) + [1], text


def test_spiece_byte_fallback_decodes_as_sentencepiece(tmp_path):
    """Byte pieces become their characters and spaces stay (the decoder had dropped every space)."""
    sp = train_spiece(tmp_path, 400, pad_id=0, eos_id=1, unk_id=2, bos_id=-1, byte_fallback=True,
                      hard_vocab_limit=False)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"extra_ids": 0}))
    ours = lmforge.load_tokenizer(tmp_path)
    for text in TEXTS + ["snow \u2603 man \U0001d518", "\u2603 first"]:
        assert ours.encode(text).ids == sp.encode(text) + [1], text
        assert ours.decode(ours.encode(text).ids) == sp.decode(sp.encode(text)), text


def albert_preprocess(text):
    """ALBERT's text clean-up before SentencePiece: spaces, quotes, accents, case."""
    text = " ".join(text.split()).replace("``", '"').replace("''", '"')
    return "".join(c for c in unicodedata.normalize("NFKD", text) if not unicodedata.combining(c)).lower()


def test_albert_spiece_matches_sentencepiece_and_albert_tokenizer(tmp_path):
    sp = train_spiece(tmp_path, pad_id=0, unk_id=1, bos_id=-1, eos_id=-1,
                      control_symbols=["[CLS]", "[SEP]"], user_defined_symbols=["[MASK]"])
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "AlbertTokenizer"}))
    ours = lmforge.load_tokenizer(tmp_path)
    cls, sep = sp.piece_to_id("[CLS]"), sp.piece_to_id("[SEP]")
    assert (ours.cls_id, ours.sep_id, ours.mask_id) == (cls, sep, sp.piece_to_id("[MASK]"))
    for text in TEXTS + ["``quoted''"]:
        assert ours.encode(text).ids == [cls, *sp.encode(albert_preprocess(text)), sep], text
    pair = ours.encode(*PAIR)
    n_a = len(sp.encode(albert_preprocess(PAIR[0]))) + 2
    assert pair.segment_ids == [0] * n_a + [1] * (len(pair) - n_a)
    pytest.importorskip("google.protobuf")
    from transformers import AlbertTokenizer

    assert_same_ids(ours, AlbertTokenizer.from_pretrained(tmp_path), TEXTS + ["a [MASK] b"])


def _key(number, wire):
    return _varint(number << 3 | wire)


def _varint(n):
    out = b""
    while n > 0x7F:
        out, n = out + bytes([n & 0x7F | 0x80]), n >> 7
    return out + bytes([n])


def _message(number, payload):
    return _key(number, 2) + _varint(len(payload)) + payload


def model_proto(pieces, model_type=1, unk_id=2, eos_id=1):
    """A ModelProto written by hand: pieces (piece, score, type), trainer and normalizer specs."""
    data = b"".join(_message(1, _message(1, p.encode()) + _key(2, 5) + struct.pack("<f", s) + _key(3, 0)
                             + _varint(t)) for p, s, t in pieces)
    trainer = _key(3, 0) + _varint(model_type) + _key(40, 0) + _varint(unk_id) + _key(41, 0) + \
        _varint((1 << 64) - 1) + _key(42, 0) + _varint(eos_id) + _key(43, 0) + _varint(0)
    return data + _message(2, trainer) + _message(3, _message(1, b"identity"))


PIECES = [("<pad>", 0, 3), ("</s>", 0, 3), ("<unk>", 0, 2), ("▁", -2, 1), ("▁hello", -1, 1), ("▁he", -3, 1),
          ("llo", -3, 1), ("▁world", -1.5, 1), *[(c, -4, 1) for c in "helowrd"]]


def test_hand_written_model_proto(tmp_path):
    (tmp_path / "spiece.model").write_bytes(model_proto(PIECES))
    tok = lmforge.load_tokenizer(tmp_path)  # bos_id -1 (a negative varint): no bos
    assert tok.tokenize("hello world  hed") == ["▁hello", "▁world", "▁he", "d", "</s>"]
    assert tok.encode("hello wörld").ids == [4, 3, 12, 2, 13, 10, 14, 1]  # ö is unknown
    assert (tok.bos_id, tok.eos_id, tok.pad_id, tok.unk_id) == (None, 1, 0, 2)
    try:
        import sentencepiece
    except ImportError:
        return
    sp = sentencepiece.SentencePieceProcessor(model_proto=(tmp_path / "spiece.model").read_bytes())
    for text in ("hello world  hed", "hello wörld", " heho  lower "):
        assert tok.encode(text).ids == sp.encode(text) + [1]


def test_bad_sentencepiece_models(tmp_path):
    (tmp_path / "spiece.model").write_bytes(model_proto(PIECES)[:-7])
    with pytest.raises(TokenizerError, match="not a usable SentencePiece model.*truncated"):
        lmforge.load_tokenizer(tmp_path)
    (tmp_path / "spiece.model").write_bytes(model_proto(PIECES, model_type=2))
    with pytest.raises(TokenizerError, match="model_type bpe is not supported"):
        lmforge.load_tokenizer(tmp_path)
    (tmp_path / "spiece.model").write_bytes(model_proto(PIECES, unk_id=99))
    with pytest.raises(TokenizerError, match="unk_id 99"):
        lmforge.load_tokenizer(tmp_path)
