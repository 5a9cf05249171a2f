"""Reading the tokenizer files of a Hugging Face model directory.

Looked for in this order (the first found wins):

    tokenizer.json             any `tokenizers` tokenizer, as saved by the fast tokenizers
    vocab.txt                  WordPiece (BERT): lower-casing and accent stripping from the config
    vocab.json + merges.txt    byte-level BPE: GPT-2 (no template) or RoBERTa (<s> A </s></s> B </s>)
    spiece.model               SentencePiece unigram (T5: A </s>; ALBERT: [CLS] A [SEP] B [SEP])

tokenizer_config.json and special_tokens_map.json, where present, name the
special tokens and the options (do_lower_case, strip_accents, add_prefix_space, ...);
added_tokens.json (token -> id), where present beside the last three, adds its tokens at its ids.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from tokenizers import AddedToken, decoders, normalizers, pre_tokenizers, processors
from tokenizers import Tokenizer as Backend
from tokenizers.models import BPE, WordPiece

from lmforge.tokenizer.spiece import ProtoError, build_unigram, parse_model, user_symbols
from lmforge.tokenizer.wrapper import ROLES, SAVED_FILES, SUMS_FILE, Tokenizer, TokenizerError
from lmforge.utils import jsontext
from lmforge.utils.checksum import check_files, verify
from lmforge.utils.model_folder import check_recorded, inside_job_folder
from lmforge.utils.errors import shown

TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "vocab.json + merges.txt", "spiece.model")
BERT_TOKENS = {"pad": "[PAD]", "unk": "[UNK]", "cls": "[CLS]", "sep": "[SEP]", "mask": "[MASK]"}
GPT2_TOKENS = {"unk": "<|endoftext|>", "bos": "<|endoftext|>", "eos": "<|endoftext|>"}
ROBERTA_TOKENS = {"pad": "<pad>", "unk": "<unk>", "cls": "<s>", "sep": "</s>", "mask": "<mask>",
                  "bos": "<s>", "eos": "</s>"}
ALBERT_TOKENS = {"cls": "[CLS]", "sep": "[SEP]", "mask": "[MASK]", "bos": "[CLS]", "eos": "[SEP]"}
# byte-level BPE tokenizers whose template is RoBERTa's <s> A </s></s> B </s>
ROBERTA_CLASSES = ("RobertaTokenizer", "BartTokenizer", "LongformerTokenizer", "MarkupLMTokenizer",
                   "BlenderbotTokenizer", "LEDTokenizer", "MvpTokenizer")
# tokenizer_config.json settings read here, of each kind: a boolean, a count, a list of tokens
_SETTINGS = {"do_lower_case": "bool", "strip_accents": "bool", "tokenize_chinese_chars": "bool",
             "keep_accents": "bool", "add_prefix_space": "bool", "max_input_chars_per_word": "count",
             "extra_ids": "count", "additional_special_tokens": "tokens"}
MAX_SETTING = 65536  # a count's bound: extra_ids=1e12 sentinel tokens filled the memory
_SAID = {"bool": "true or false", "count": f"an integer in [0, {MAX_SETTING}]",
         "tokens": "a list of tokens (strings or {\"content\": ...} objects)",
         "token": "a token (a string or {\"content\": ...}) or null"}
# names a tokenizer.json without a config gives its special tokens
KNOWN_NAMES = {"pad": ("[PAD]", "<pad>"), "unk": ("[UNK]", "<unk>"), "cls": ("[CLS]",),
               "sep": ("[SEP]",), "mask": ("[MASK]", "<mask>"),
               "bos": ("<s>", "<|endoftext|>", "<|begin_of_text|>"),
               "eos": ("</s>", "<|endoftext|>", "<|end_of_text|>")}


def _read_json(file: Path) -> dict:
    if not file.is_file():
        return {}
    try:
        data = jsontext.loads(file.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise TokenizerError(f"{file} is not valid JSON: {err}") from None
    if not isinstance(data, dict):
        raise TokenizerError(f"{file} must hold a JSON object")
    return data


def read_config(path: Path) -> dict:
    """tokenizer_config.json over special_tokens_map.json (both optional), its _SETTINGS checked."""
    config = {**_read_json(path / "special_tokens_map.json"), **_read_json(path / "tokenizer_config.json")}
    for key, kind in _SETTINGS.items():
        value = config.get(key)
        if value is not None and not _of_kind(value, kind):  # the tokenizers library raised a TypeError
            raise TokenizerError(f"{path}: the tokenizer config's {key} must be {_SAID[kind]}, "
                                 f"got {shown(value)}")
    for key in (f"{role}_token" for role in ROLES):  # a number or a list there switched the role off unsaid
        if config.get(key) is not None and not _of_kind(config[key], "token"):
            raise TokenizerError(f"{path}: the tokenizer config's {key} must be {_SAID['token']}, "
                                 f"got {shown(config[key])}")
    return {k: v for k, v in config.items() if not (k in _SETTINGS and v is None)}  # null: the default


def _of_kind(value, kind: str) -> bool:
    if kind == "bool":  # bool("false") is true
        return isinstance(value, bool)
    if kind == "count":
        return type(value) is int and 0 <= value <= MAX_SETTING
    if kind == "token":
        return isinstance(value, str) or isinstance(value, dict) and isinstance(value.get("content"), str)
    return isinstance(value, list) and all(isinstance(t, (str, dict)) for t in value)


def configured_tokens(config: dict) -> dict:
    """role -> token string for the roles the config names (None: the role is switched off)."""
    tokens = {}
    for role in ROLES:
        if f"{role}_token" in config:
            value = config[f"{role}_token"]
            value = value.get("content") if isinstance(value, dict) else value
            tokens[role] = value if isinstance(value, str) else None
    return tokens


def token_flags(config: dict) -> dict:
    """token -> AddedToken options (lstrip, rstrip, ...) for the special tokens the config spells out."""
    keys = ("lstrip", "rstrip", "single_word", "normalized")
    return {v["content"]: {k: bool(v[k]) for k in keys if k in v} for role in ROLES
            if isinstance(v := config.get(f"{role}_token"), dict) and "content" in v}


def _class_name(config: dict) -> str:
    return str(config.get("tokenizer_class") or "").removesuffix("Fast")


def _read_text(file: Path) -> str:
    try:
        return file.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise TokenizerError(f"{file} is not UTF-8 text: {err}") from None


def wordpiece(path: Path, config: dict, tokens: dict) -> Backend:
    """BERT's WordPiece from vocab.txt: one token per line, the line number is its id."""
    lines = _read_text(path / "vocab.txt").split("\n")
    vocab = {token: i for i, token in enumerate(lines[:-1] if lines[-1] == "" else lines)}
    if not any(token.strip() for token in vocab):  # every word would be [UNK]: a damaged file
        raise TokenizerError(f"{path / 'vocab.txt'} holds no tokens (one token a line)")
    backend = Backend(WordPiece(vocab, unk_token=tokens.get("unk") or "[UNK]",
                                max_input_chars_per_word=config.get("max_input_chars_per_word", 100)))
    # strip_accents None follows lower-casing, as in the original BERT
    backend.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=config.get("tokenize_chinese_chars", True),
        strip_accents=config.get("strip_accents"), lowercase=config.get("do_lower_case", True))
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.decoder = decoders.WordPiece(prefix="##")
    return backend


def byte_level_bpe(path: Path, config: dict) -> Backend:
    """GPT-2's byte-level BPE from vocab.json (token -> id) and merges.txt (one "a b" merge a line)."""
    vocab = _read_json(path / "vocab.json")
    # a byte missing from the vocabulary is dropped from the text without a word (the reference maps it to
    # its unknown token): a vocabulary without all 256 is no byte-level one
    missing = [b for b in pre_tokenizers.ByteLevel.alphabet() if b not in vocab]
    if missing:
        raise TokenizerError(f"{path / 'vocab.json'} lacks {len(missing)} of the 256 byte tokens (such as "
                             f"{sorted(missing)[0]!r}): byte-level BPE would drop the text they stand for")
    merges = []
    for n, line in enumerate(_read_text(path / "merges.txt").split("\n"), 1):
        if line.startswith("#version") or not line.strip():
            continue
        pair = tuple(line.split(" "))
        if len(pair) != 2:
            raise TokenizerError(f"{path / 'merges.txt'} line {n}: expected two tokens, got {line!r}")
        merges.append(pair)
    try:
        backend = Backend(BPE(vocab, merges, fuse_unk=False))
    except Exception as err:  # a merge of tokens missing from the vocabulary
        raise TokenizerError(f"{path}: vocab.json and merges.txt do not fit: {err}") from None
    add_prefix_space = bool(config.get("add_prefix_space", False))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space)
    backend.decoder = decoders.ByteLevel()
    return backend


def sentencepiece(path: Path, config: dict, albert: bool) -> tuple:
    """(backend, the model's own special tokens) from spiece.model; ALBERT normalises first."""
    try:
        spm = parse_model((path / "spiece.model").read_bytes())
        steps = []
        if albert:  # ALBERT's preprocessing before the SentencePiece normaliser
            steps = [normalizers.Replace("``", '"'), normalizers.Replace("''", '"')]
            if not config.get("keep_accents", False):
                steps += [normalizers.NFKD(), normalizers.StripAccents()]
            if config.get("do_lower_case", True):
                steps.append(normalizers.Lowercase())
        backend = build_unigram(spm, steps)
    except ProtoError as err:
        raise TokenizerError(f"{path / 'spiece.model'} is not a usable SentencePiece model: {err}") from None
    # matched in the normalised text, as SentencePiece matches them
    backend.add_tokens([AddedToken(t, normalized=True) for t in user_symbols(spm)])
    own = {role: spm.piece(role) for role in ("unk", "bos", "eos", "pad") if spm.piece(role)}
    return backend, own


def from_tokenizer_json(path: Path, config: dict) -> tuple:
    """(backend, special tokens) of a tokenizer.json; roles guessed from names without a config."""
    try:
        backend = Backend.from_file(str(path / "tokenizer.json"))
    except Exception as err:
        raise TokenizerError(f"cannot read {path / 'tokenizer.json'}: {err}") from None
    tokens = configured_tokens(config)
    if not tokens:
        added = {t.content for t in backend.get_added_tokens_decoder().values() if t.special}
        tokens = {role: next(n for n in names if n in added) for role, names in KNOWN_NAMES.items()
                  if any(n in added for n in names)}
    return backend, tokens


def template(backend: Backend, single: list, pair: list) -> processors.TemplateProcessing:
    """A post-processor from pieces such as ["[CLS]:0", "$A:0", "[SEP]:0"] (":1" marks segment B)."""
    specials = {p.rsplit(":", 1)[0] for p in single + pair if not p.startswith("$")}
    ids = [(t, backend.token_to_id(t)) for t in sorted(specials)]
    return processors.TemplateProcessing(single=single, pair=pair, special_tokens=ids)


def post_processor(backend: Backend, style: str, tokens: dict):
    """The special-token template of a style: bert, roberta, t5 (append eos); None for the others."""
    cls, sep, eos = tokens.get("cls"), tokens.get("sep"), tokens.get("eos")
    if style == "bert" and cls and sep:
        return template(backend, [f"{cls}:0", "$A:0", f"{sep}:0"],
                        [f"{cls}:0", "$A:0", f"{sep}:0", "$B:1", f"{sep}:1"])
    if style == "roberta" and cls and sep:
        # <s> A </s></s> B </s>, all segment 0; as Hugging Face's, it trims a word's leading space off its
        # offsets (a template kept " world" at (5, 11): a span answer began with the space)
        prefix = getattr(backend.pre_tokenizer, "add_prefix_space", False)
        return processors.RobertaProcessing((sep, backend.token_to_id(sep)), (cls, backend.token_to_id(cls)),
                                            trim_offsets=True, add_prefix_space=bool(prefix))
    if style == "t5" and eos:
        return template(backend, ["$A:0", f"{eos}:0"], ["$A:0", f"{eos}:0", "$B:0", f"{eos}:0"])
    return None


def _register(backend: Backend, tokens: dict, style: str | None, flags: dict) -> None:
    """Make every special token match whole (before normalisation) and be skipped by decode."""
    added = []
    for role, token in tokens.items():
        # RoBERTa's <mask> takes the space before it: byte-level words carry their leading space
        lstrip = style == "roberta" and role == "mask"
        options = {"normalized": False, "lstrip": lstrip, **flags.get(token, {})}
        added.append(AddedToken(token, special=True, **options))
    backend.add_special_tokens(added)


def holds_tokenizer(path) -> bool:
    """Whether a directory has a tokenizer file of any kind (load_tokenizer then reads it whole or says
    what is wrong): a model without one is told from one whose tokenizer is damaged."""
    names = (*SAVED_FILES, "vocab.txt", "vocab.json", "merges.txt", "spiece.model")
    return any((Path(path) / name).is_file() for name in names)


def _missing_files(path: Path) -> str:
    found = sorted(p.name for p in path.iterdir())
    if not found:
        return f"{path} is empty: no tokenizer files"
    return (f"{path} has no tokenizer files (looked for {', '.join(TOKENIZER_FILES)}); "
            f"found: {', '.join(found[:12])}{' ...' if len(found) > 12 else ''}")


def _build(path: Path, config: dict) -> tuple:
    """(backend, special tokens, style) from the first tokenizer file found; the style (bert, roberta,
    gpt2, t5 or tokenizer.json) selects the special-token template."""
    named = configured_tokens(config)
    if (path / "tokenizer.json").is_file():
        backend, tokens = from_tokenizer_json(path, config)
        return backend, tokens, "tokenizer.json"
    if (path / "vocab.txt").is_file():
        tokens = {**BERT_TOKENS, **named}
        return wordpiece(path, config, tokens), tokens, "bert"
    pair_roles = {"cls", "sep"} <= {role for role, token in named.items() if token}
    if (path / "vocab.json").is_file():
        if not (path / "merges.txt").is_file():
            raise TokenizerError(f"{path} has vocab.json but no merges.txt (byte-level BPE needs both)")
        roberta = _class_name(config) in ROBERTA_CLASSES or pair_roles
        tokens = {**(ROBERTA_TOKENS if roberta else GPT2_TOKENS), **named}
        return byte_level_bpe(path, config), tokens, "roberta" if roberta else "gpt2"
    if (path / "spiece.model").is_file():
        albert = _class_name(config).startswith("Albert") or pair_roles
        backend, own = sentencepiece(path, config, albert)
        return backend, {**own, **(ALBERT_TOKENS if albert else {}), **named}, "bert" if albert else "t5"
    raise TokenizerError(_missing_files(path))


def extra_tokens(config: dict, style: str | None) -> list:
    """Further special tokens: T5's sentinels <extra_id_99> ... <extra_id_0> (so <extra_id_0> gets
    the highest id), then the config's additional_special_tokens."""
    name = _class_name(config)
    n = config.get("extra_ids", 100 if style == "t5" and (not name or name.startswith("T5")) else 0)
    extra = [f"<extra_id_{i}>" for i in reversed(range(int(n or 0)))]
    for token in config.get("additional_special_tokens") or []:
        token = token.get("content") if isinstance(token, dict) else token
        if isinstance(token, str) and token not in extra:
            extra.append(token)
    return extra


def added_tokens(path: Path) -> list:
    """[(token, id)] of added_tokens.json (token -> id: the tokens added past the vocabulary, as Hugging
    Face's save_pretrained writes them beside vocab.txt, vocab.json or spiece.model), by id."""
    file = path / "added_tokens.json"
    added = _read_json(file)
    bad = next((k for k, v in added.items() if type(v) is not int or not 0 <= v < 1 << 31), None)
    if bad is not None:
        raise TokenizerError(f"{file}: the id of {shown(bad)} must be an integer >= 0, got "
                             f"{shown(added[bad])}")
    return sorted(added.items(), key=lambda item: item[1])


def _add_listed(backend: Backend, listed: list, special: set) -> None:
    """Add the tokens of added_tokens.json missing from the vocabulary (normalised as Hugging Face's
    added words are, special ones whole)."""
    for token, _ in listed:
        if backend.token_to_id(token) is None:
            if token in special:
                backend.add_special_tokens([AddedToken(token, special=True, normalized=False)])
            else:
                backend.add_tokens([AddedToken(token, normalized=True)])


def _check_listed(path: Path, backend: Backend, listed: list) -> None:
    """A TokenizerError where a token of added_tokens.json got another id than the file gives it."""
    for token, index in listed:
        if backend.token_to_id(token) != index:
            raise TokenizerError(f"{path / 'added_tokens.json'}: {shown(token)} has id {index} there but "
                                 f"{backend.token_to_id(token)} here (added ids follow the vocabulary's)")


def check_sealed(path: Path) -> None:
    """A TokenizerError naming the file where the checksums Tokenizer.save kept beside a tokenizer alone
    (SUMS_FILE, signed) are damaged, or a file they list is missing or changed; nothing without them (a
    Hugging Face folder, or one written before they were kept, reads unverified)."""
    record = path / SUMS_FILE
    if not (record.exists() or record.is_symlink()):
        return
    if not record.is_file():  # a folder or a dangling link there: the record is damaged, never skipped
        raise TokenizerError(f"{record}: not a file of checksums (damaged); save the tokenizer again")
    try:
        sums = jsontext.loads(record.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise TokenizerError(f"{record}: not readable JSON ({err})") from None
    sums = verify(sums, "checksum", record, error=TokenizerError)
    check_files(path, {k: v for k, v in sums.items() if k != "checksum"}, record, TokenizerError)


def load_tokenizer(path: str | os.PathLike) -> Tokenizer:
    """Read the tokenizer of a Hugging Face (or lmforge) model directory (or of the model in a job's
    output folder: utils/model_folder.py), its files verified where Tokenizer.save kept their checksums."""
    if not str(path).strip():  # Path("") is the working folder
        raise TokenizerError("the tokenizer's directory is an empty name: give a directory")
    path = inside_job_folder(Path(path))
    if not path.is_dir():
        raise TokenizerError(f"{path} is not a directory" if path.exists() else f"{path} does not exist")
    config = read_config(path)
    backend, tokens, style = _build(path, config)
    for name in SAVED_FILES:  # read whole first: a file that is no JSON is named as such
        check_recorded(path, name, TokenizerError)
    check_sealed(path)
    tokens = {role: token for role, token in tokens.items() if token}
    if style == "tokenizer.json":  # it carries its own added tokens and template
        _register(backend, {r: t for r, t in tokens.items() if backend.token_to_id(t) is None}, None, {})
    else:  # added_tokens.json's ids first: the ids the model's embeddings were made for
        listed, extra = added_tokens(path), extra_tokens(config, style)
        _add_listed(backend, listed, {*tokens.values(), *extra})
        _register(backend, tokens, style, token_flags(config))
        backend.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                    for t in extra if backend.token_to_id(t) is None])
        _check_listed(path, backend, listed)
        processor = post_processor(backend, style, tokens)
        if processor is not None:
            backend.post_processor = processor
    limit = config.get("model_max_length")
    # HF writes 1e30 for "none"; true is no length (it was 1: embed cut every text to one token)
    limit = limit if type(limit) is int and 0 < limit < 10**9 else None
    return Tokenizer(backend, tokens, limit)
