"""lmforge's tokenizer: a `tokenizers.Tokenizer` plus the roles of its special tokens.

Encodings carry what the models take: token ids, segment (token type) ids and an
attention mask. Batches are right-padded tensors ready for `model(ids, mask,
segment_ids=...)`.
"""
from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import torch
from tokenizers import Tokenizer as Backend

from lmforge.config import atomic_write_text
from lmforge.config.model import MAX_LEN
from lmforge.config.options import checked_argument
from lmforge.tokenizer.words import token_ids, word_starts
from lmforge.utils.atomic import writable_folder
from lmforge.utils.checksum import sha256, sign
from lmforge.utils.errors import OptionsError, checked_text
from lmforge.utils.jsonfile import json_object
from lmforge.utils.model_folder import record_sums

ROLES = ("pad", "unk", "cls", "sep", "mask", "bos", "eos")
PADDINGS = ("longest", "max_length")
SAVED_FILES = ("tokenizer.json", "tokenizer_config.json")  # what save writes (beside a model: recorded)
SUMS_FILE = "sha256.json"  # beside a tokenizer with no model of its own: its files' checksums, signed (seal)
MAX_CUT = 2 ** 63 - 1  # a truncation length the backend's counters hold (2**64 overflowed them)


class TokenizerError(ValueError):
    """A tokenizer directory that cannot be read: missing, empty, foreign or corrupt files."""


@dataclass
class Encoding:
    """One encoded text (or text pair): ids, segment ids and attention mask, all of one length."""

    ids: list
    segment_ids: list
    attention_mask: list
    # per token: (start, end) characters in its own text ((0, 0) for special tokens), and which
    # text it came from (0, 1 for the pair, None for a special token); for span tasks
    offsets: Optional[list] = field(default=None, repr=False, compare=False)
    sequence_ids: Optional[list] = field(default=None, repr=False, compare=False)
    truncated: bool = field(default=False, repr=False, compare=False)  # cut to max_length (tokens left over)

    def __len__(self) -> int:
        return len(self.ids)


@dataclass
class Batch:
    """Right-padded encodings of several texts, each field a (B, T) long tensor."""

    input_ids: torch.Tensor
    segment_ids: torch.Tensor
    attention_mask: torch.Tensor

    def to(self, device) -> "Batch":
        """The same batch on `device`."""
        return Batch(*(t.to(device) for t in (self.input_ids, self.segment_ids, self.attention_mask)))


def as_text(text, what: str = "text", shown: str | None = None) -> str:
    """`text` by checked_text's rule (a str of valid Unicode, else an OptionsError naming `what`, said as
    `shown`), save that UTF-8 bytes are taken too, on purpose (encode("café".encode())), and decoded."""
    if isinstance(text, (bytes, bytearray)):
        try:
            return bytes(text).decode("utf-8")
        except UnicodeDecodeError as err:  # said as checked_text says a lone surrogate
            raise OptionsError(f"{shown or what} is not valid Unicode: byte {err.object[err.start]:#04x} is "
                               f"not UTF-8 at position {err.start}", what) from None
    return checked_text(text, what, shown, "a text or UTF-8 bytes")


def _role_id(role: str) -> property:
    return property(lambda self: self.special_id(role), doc=f"Id of the {role} token (None if absent).")


class Tokenizer:
    """Text <-> token ids with the special-token template of the model it belongs to."""

    pad_id, unk_id, cls_id, sep_id = _role_id("pad"), _role_id("unk"), _role_id("cls"), _role_id("sep")
    mask_id, bos_id, eos_id = _role_id("mask"), _role_id("bos"), _role_id("eos")

    def __init__(self, backend: Backend, special_tokens: dict, model_max_length: int | None = None) -> None:
        unknown = set(special_tokens) - set(ROLES)
        if unknown:
            raise ValueError(f"unknown special token roles {sorted(unknown)}; roles are {', '.join(ROLES)}")
        self.backend = backend
        # held from setting a call's truncation to clearing it: threads (a server's workers) share this
        # backend; per tokenizer, so a thread with its own (the server's event loop) never waits on it
        self._truncation = threading.Lock()
        backend.no_padding()  # a tokenizer.json may carry fixed padding/truncation; ours is per call
        backend.no_truncation()
        self.special_tokens = dict(special_tokens)  # role -> token string, e.g. {"cls": "[CLS]"}
        self.model_max_length = model_max_length

    @property
    def vocab_size(self) -> int:
        """Number of ids, added tokens included."""
        return self.backend.get_vocab_size(with_added_tokens=True)

    def __len__(self) -> int:
        return self.vocab_size

    def __repr__(self) -> str:
        model = type(self.backend.model).__name__
        return f"Tokenizer({model}, vocab_size={self.vocab_size}, special_tokens={self.special_tokens})"

    def special_id(self, role: str) -> int | None:
        """Id of the special token playing `role` (pad, unk, cls, sep, mask, bos, eos), or None."""
        token = self.special_tokens.get(role)
        return None if token is None else self.backend.token_to_id(token)

    def token_to_id(self, token: str) -> int | None:
        """Id of one token string (None if it is not in the vocabulary)."""
        return self.backend.token_to_id(token)

    def id_to_token(self, id: int) -> str | None:
        """Token string of one id."""
        return self.backend.id_to_token(id)

    def tokenize(self, text, pair=None) -> list:
        """The token strings of `text` (and `pair`), special tokens included."""
        return self._encode([text], None if pair is None else [pair], True, None)[0].tokens

    def encode(self, text, pair=None, add_special_tokens: bool = True,
               max_length: int | None = None) -> Encoding:
        """Ids, segment ids and attention mask of one text or text pair (truncated to max_length)."""
        (enc,) = self._encode([text], None if pair is None else [pair], add_special_tokens, max_length)
        return Encoding(list(enc.ids), list(enc.type_ids), list(enc.attention_mask), list(enc.offsets),
                        list(enc.sequence_ids), bool(enc.overflowing))

    def encode_batch(self, texts, pairs=None, max_length: int | None = None, padding: str = "longest",
                     add_special_tokens: bool = True) -> Batch:
        """Encode several texts (or pairs) into right-padded (B, T) tensors.

        Sequences longer than `max_length` are truncated (pairs longest first); padding
        is to the longest sequence, or to `max_length` with padding="max_length".
        """
        if padding not in PADDINGS:
            raise ValueError(f"padding={padding!r} is not one of {', '.join(PADDINGS)}")
        if padding == "max_length" and max_length is None:
            raise ValueError("padding='max_length' needs max_length")
        if padding == "max_length":  # the batch is allocated that long: 10**12 asked for 16 TB
            max_length = checked_argument("max_length", "int", {"low": 1, "high": MAX_LEN}, max_length)
        encodings = self._encode(list(texts), None if pairs is None else list(pairs), add_special_tokens,
                                 max_length, batch=True)
        T = max_length if padding == "max_length" else max((len(e.ids) for e in encodings), default=0)
        if any(len(e.ids) < T for e in encodings) and self.pad_id is None:
            raise ValueError("this tokenizer has no pad token; set one, e.g. "
                             "tok.special_tokens['pad'] = tok.special_tokens['eos']")
        # one tensor a field from padded lists: three small tensors a row took 1.0 vs 0.45 ms a batch of 32
        # 64-token texts, 0.70 vs 0.17 ms of 14-token ones (2 % of an int8 MiniLM's pass over short texts)
        columns = [(e.ids, e.type_ids, e.attention_mask) for e in encodings]
        fields = [[row[f] + [fill] * (T - len(row[f])) for row in columns]
                  for f, fill in enumerate((self.pad_id or 0, 0, 0))]
        ids, segments, mask = (torch.tensor(rows, dtype=torch.long).view(len(columns), T) for rows in fields)
        return Batch(ids, segments, mask)

    def _encode(self, texts: list, pairs: list | None, add_special_tokens: bool, max_length: int | None,
                batch: bool = False):
        # encode's one text is named text (pair), encode_batch's texts[i] (pairs[i]), as the caller gave them
        name, pair = ("texts", "pairs") if batch else ("text", "pair")
        texts = [as_text(t, name, f"texts[{i}]" if batch else None) for i, t in enumerate(texts)]
        if pairs is not None:
            if len(pairs) != len(texts):
                raise ValueError(f"{len(texts)} texts but {len(pairs)} pairs")
            texts = [(t, as_text(p, pair, f"pairs[{i}]" if batch else None))
                     for i, (t, p) in enumerate(zip(texts, pairs))]
        # a float or a bool is no length (the backend takes True as 1 and fails on 2.5 without naming it);
        # past the backend's 64-bit count it raised OverflowError naming nothing (10**12 cuts nothing: taken)
        max_length = checked_argument("max_length", "Optional[int]", {"low": None, "high": MAX_CUT},
                                      max_length)
        if max_length is not None:
            specials = self.backend.num_special_tokens_to_add(pairs is not None) if add_special_tokens else 0
            if max_length <= specials:  # the backend would silently not truncate at all
                raise ValueError(f"max_length={max_length} leaves no room next to {specials} special tokens")
        with self._truncation:  # the setting lives on the backend: another thread's call must not see it
            if max_length is not None:
                self.backend.enable_truncation(max_length, strategy="longest_first")
            try:
                return self.backend.encode_batch(texts, add_special_tokens=add_special_tokens)
            except Exception as err:  # the Rust side raises plain Exceptions, e.g. max_length too small
                raise ValueError(f"cannot encode: {err}") from None
            finally:
                self.backend.no_truncation()

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        """Text of a sequence of ids (a list or a 1-D tensor)."""
        return self.backend.decode(token_ids(ids, "decode"), skip_special_tokens=skip_special_tokens)

    def word_starts(self, ids) -> list:
        """True at the first piece of each word of `ids` (see lmforge.tokenizer.words)."""
        return word_starts(self, ids)

    def save(self, path: str | os.PathLike) -> Path:
        """Write tokenizer.json and tokenizer_config.json (special tokens) to the directory `path`, their
        checksums kept (seal: load_tokenizer verifies them); an empty name, a symbolic link or a file there
        is refused (UnsafePath, an OptionsError), as model.save does."""
        path = writable_folder(path, "tokenizer directory")
        path.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path / "tokenizer.json", self.backend.to_str(pretty=True))
        # in ROLES' order, not the order the roles were set in: a tokenizer loaded back writes the same bytes
        tokens = self.special_tokens
        config = {"tokenizer_class": "PreTrainedTokenizerFast",
                  **{f"{role}_token": tokens[role] for role in ROLES if role in tokens}}
        if self.model_max_length is not None:
            config["model_max_length"] = self.model_max_length
        config["model_input_names"] = model_input_names(self.backend, path)
        text = json.dumps(config, indent=2, ensure_ascii=False) + "\n"
        atomic_write_text(path / "tokenizer_config.json", text)
        seal(path)
        return path


def model_input_names(backend: Backend, folder: Path | None = None) -> list:
    """What the reference's generic fast tokenizer (tokenizer_config.json's PreTrainedTokenizerFast) should
    return: it gives no token_type_ids unless they are named (transformers 5), so a BERT pair's second
    segment would reach an exported model as segment 0. Named where a pair's segments differ and the
    model in `folder`, if one is there yet, has segment embeddings (a BART over a BERT vocabulary takes
    none: its generate refuses them)."""
    try:
        typed = any(backend.encode("a", "b").type_ids)
    except Exception:  # the backend's own error (a vocabulary with no unknown token): read as untyped
        typed = False
    return ["input_ids", *(["token_type_ids"] if typed and _segments(folder) else []), "attention_mask"]


def _segments(folder: Path | None) -> bool:
    """Whether the model saved in `folder` has segment embeddings (lmforge's n_segments, the reference's
    type_vocab_size, more than one); True where no model is there to ask."""
    meta = json_object(folder / "config.json") if folder else None
    if meta is None:
        return True
    own = meta.get("config")
    count = own.get("n_segments", 2) if isinstance(own, dict) else meta.get("type_vocab_size", 0)
    return isinstance(count, int) and count > 1


def name_model_inputs(folder: Path) -> None:
    """Name the model inputs of an lmforge tokenizer_config.json in `folder` for the model now beside it
    (convert: one written before they were named, or beside another model); a reference tokenizer's own
    class, or a file that is not lmforge's, is left as it is."""
    config_file, backend_file = folder / "tokenizer_config.json", folder / "tokenizer.json"
    config = json_object(config_file)
    if not (config is not None and config.get("tokenizer_class") == "PreTrainedTokenizerFast"
            and backend_file.is_file()):
        return
    names = model_input_names(Backend.from_file(str(backend_file)), folder)
    if config.get("model_input_names") != names:
        atomic_write_text(config_file, json.dumps({**config, "model_input_names": names}, indent=2,
                                                  ensure_ascii=False) + "\n")


def seal(folder: Path) -> None:
    """Keep the checksums of the files Tokenizer.save wrote in `folder`: in the config.json of an lmforge
    model there, else in SUMS_FILE beside them (a tokenizer alone, or beside a Hugging Face model, has no
    config of lmforge's to record them in). load_tokenizer verifies either: a changed vocabulary entry is
    still valid JSON, and would otherwise load unsaid."""
    if record_sums(folder, SAVED_FILES):
        (folder / SUMS_FILE).unlink(missing_ok=True)  # one record: the model's config.json
        return
    sums = sign({name: sha256(folder / name) for name in SAVED_FILES}, "checksum")
    atomic_write_text(folder / SUMS_FILE, json.dumps(sums, indent=1) + "\n")
