"""SentencePiece models (spiece.model) read without the sentencepiece or protobuf runtimes.

A .model file is a serialised `sentencepiece.ModelProto` (Kudo & Richardson,
2018). Protocol buffers are a flat list of (field number, wire type, value)
records, so the few fields a tokenizer needs are read here by hand:

    ModelProto     1 pieces (repeated SentencePiece)  2 trainer_spec  3 normalizer_spec
    SentencePiece  1 piece (string)  2 score (float)  3 type (1 normal, 2 unknown,
                   3 control, 4 user-defined, 5 unused, 6 byte)
    TrainerSpec    3 model_type (1 unigram, 2 bpe, 3 word, 4 char)  35 byte_fallback
                   40 unk_id  41 bos_id  42 eos_id  43 pad_id
    NormalizerSpec 2 precompiled_charsmap  3 add_dummy_prefix  4 remove_extra_whitespaces

and rebuilt as a `tokenizers` Unigram model behind Metaspace pre-tokenisation,
which segments exactly like SentencePiece's Viterbi search.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field

from tokenizers import Regex
from tokenizers import Tokenizer as Backend
from tokenizers import decoders, normalizers, pre_tokenizers
from tokenizers.models import Unigram

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
MODEL_TYPES = {1: "unigram", 2: "bpe", 3: "word", 4: "char"}
METASPACE = "\u2581"  # "▁", SentencePiece's visible space


class ProtoError(ValueError):
    """Bytes that are not a well-formed SentencePiece ModelProto."""


@dataclass
class SentencePieceModel:
    """The fields of a ModelProto that tokenisation depends on (defaults as in the .proto)."""

    pieces: list = field(default_factory=list)  # [(piece, score, type)]
    model_type: int = 1
    byte_fallback: bool = False
    ids: dict = field(default_factory=lambda: {"unk": 0, "bos": 1, "eos": 2, "pad": -1})
    charsmap: bytes = b""
    add_dummy_prefix: bool = True
    remove_extra_whitespaces: bool = True

    def piece(self, role: str) -> str | None:
        """The piece with the trainer's id for `role` (unk, bos, eos, pad), None when disabled."""
        i = self.ids[role]
        return self.pieces[i][0] if 0 <= i < len(self.pieces) else None


def _varint(buf: bytes, i: int) -> tuple:
    value = shift = 0
    while True:
        byte = buf[i]
        i += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, i
        shift += 7


def fields(buf: bytes):
    """Yield (field number, value) of one protobuf message: ints for varints, bytes otherwise."""
    i = 0
    try:
        while i < len(buf):
            key, i = _varint(buf, i)
            number, wire = key >> 3, key & 7
            if wire == 0:
                value, i = _varint(buf, i)
            elif wire in (1, 5):  # fixed 64 / 32 bit
                width = 8 if wire == 1 else 4
                value, i = buf[i:i + width], i + width
            elif wire == 2:  # length-delimited: strings, bytes, sub-messages
                n, i = _varint(buf, i)
                value, i = buf[i:i + n], i + n
            else:
                raise ProtoError(f"unsupported wire type {wire} at byte {i}")
            if i > len(buf):
                raise IndexError
            yield number, value
    except IndexError:
        raise ProtoError(f"truncated message at byte {i} of {len(buf)}") from None


def _int32(value: int) -> int:
    """Negative int32 values are varints of their 64-bit two's complement."""
    return value - (1 << 64) if value >= 1 << 63 else value


def _piece(buf: bytes) -> tuple:
    piece, score, kind = "", 0.0, NORMAL
    for number, value in fields(buf):
        if number == 1:
            piece = value.decode("utf-8")
        elif number == 2:
            (score,) = struct.unpack("<f", value)
        elif number == 3:
            kind = value
    return piece, score, kind


def parse_model(data: bytes) -> SentencePieceModel:
    """Read the bytes of a .model file."""
    spm = SentencePieceModel()
    roles = {40: "unk", 41: "bos", 42: "eos", 43: "pad"}
    try:
        for number, value in fields(data):
            if number == 1:
                spm.pieces.append(_piece(value))
            elif number == 2:
                for n, v in fields(value):
                    if n == 3:
                        spm.model_type = v
                    elif n == 35:
                        spm.byte_fallback = bool(v)
                    elif n in roles:
                        spm.ids[roles[n]] = _int32(v)
            elif number == 3:
                for n, v in fields(value):
                    if n == 2:
                        spm.charsmap = bytes(v)
                    elif n == 3:
                        spm.add_dummy_prefix = bool(v)
                    elif n == 4:
                        spm.remove_extra_whitespaces = bool(v)
    except (UnicodeDecodeError, struct.error, AttributeError, TypeError) as err:
        raise ProtoError(f"malformed field: {err}") from None
    if not spm.pieces:
        raise ProtoError("no pieces")
    return spm


def build_unigram(spm: SentencePieceModel, pre_normalizers: list = ()) -> Backend:
    """A `tokenizers` backend segmenting like SentencePiece (Unigram model only)."""
    kind = MODEL_TYPES.get(spm.model_type, str(spm.model_type))
    if kind != "unigram":
        raise ProtoError(f"model_type {kind} is not supported (only unigram SentencePiece models)")
    unk_id = spm.ids["unk"]
    if not 0 <= unk_id < len(spm.pieces):
        raise ProtoError(f"unk_id {unk_id} is outside the {len(spm.pieces)} pieces")
    backend = Backend(Unigram([(p, s) for p, s, _ in spm.pieces], unk_id=unk_id,
                              byte_fallback=spm.byte_fallback))
    steps = list(pre_normalizers)
    if spm.charsmap:
        steps.append(normalizers.Precompiled(spm.charsmap))
    if spm.remove_extra_whitespaces:  # SentencePiece's: leading, trailing and repeated U+0020 only (a tab
        # or a no-break space the rules keep is a character; WhitespaceSplit had cut the text at them)
        steps += [normalizers.Replace(Regex(" {2,}"), " "), normalizers.Replace(Regex("^ | $"), "")]
    if spm.add_dummy_prefix:  # always, as SentencePiece does: the text's own leading space too, which
        # Metaspace's prepending skips; in the normaliser, so a user symbol never gets one after it
        steps.append(normalizers.Prepend(METASPACE))
    if steps:
        backend.normalizer = normalizers.Sequence(steps)
    prepend = "always" if spm.add_dummy_prefix else "never"
    backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement=METASPACE, prepend_scheme="never",
                                                     split=True)
    # Metaspace first: it drops every "▁" of the first token, which after Fuse was the whole text
    # ("Helloworld"); then the <0xNN> byte pieces of byte fallback become their characters
    decode = [decoders.ByteFallback(), decoders.Fuse()] if spm.byte_fallback else []
    backend.decoder = decoders.Sequence(
        [decoders.Metaspace(replacement=METASPACE, prepend_scheme=prepend, split=True), *decode])
    return backend


def user_symbols(spm: SentencePieceModel) -> list:
    """User-defined pieces, which SentencePiece matches whole in the text before segmenting."""
    return [p for p, _, kind in spm.pieces if kind == USER_DEFINED]
