"""lmforge.load_tokenizer against the reference tokenizers (transformers): WordPiece and byte-level BPE,
and the wrapper (save, batches, threads, bad input and settings); SentencePiece models are tested in
test_tokenizer_sentencepiece.py.

Every reference is built here from files written by the test: a WordPiece vocab.txt and byte-level BPE
vocab.json + merges.txt.
"""
import json
import re

import pytest
import torch
from tokenizers import Tokenizer as Backend
from tokenizers import models, normalizers, pre_tokenizers, trainers

import lmforge
from lmforge.tokenizer import TokenizerError
from tests.tokenizer_cases import CORPUS, PAIR, TEXTS, assert_same_ids

# ---------------------------------------------------------------- WordPiece (BERT)

@pytest.fixture(scope="module")
def bert_vocab(tmp_path_factory):
    backend = Backend(models.WordPiece(unk_token="[UNK]"))
    backend.normalizer = normalizers.BertNormalizer(lowercase=False, strip_accents=False)
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    backend.train_from_iterator(CORPUS + [c.lower() for c in CORPUS],
                                trainers.WordPieceTrainer(vocab_size=300, special_tokens=specials,
                                                          show_progress=False))
    vocab = sorted(backend.get_vocab().items(), key=lambda kv: kv[1])
    path = tmp_path_factory.mktemp("bert") / "vocab.txt"
    path.write_text("".join(token + "\n" for token, _ in vocab), encoding="utf-8")
    return path


def python_bert_tokenizer():
    """transformers' pure-Python BERT tokenizer (BertTokenizer itself before v5)."""
    try:
        from transformers.models.bert.tokenization_bert_legacy import BertTokenizerLegacy
    except ImportError:
        from transformers import BertTokenizer as BertTokenizerLegacy
    return BertTokenizerLegacy


@pytest.mark.parametrize("options", [{}, {"do_lower_case": False},
                                     {"do_lower_case": True, "strip_accents": False},
                                     {"do_lower_case": False, "strip_accents": True}])
def test_wordpiece_matches_bert_tokenizer(bert_vocab, tmp_path, options):
    from transformers import BertTokenizer

    (tmp_path / "vocab.txt").write_bytes(bert_vocab.read_bytes())
    if options:
        (tmp_path / "tokenizer_config.json").write_text(json.dumps(options))
    ours = lmforge.load_tokenizer(tmp_path)
    assert_same_ids(ours, BertTokenizer.from_pretrained(tmp_path))
    # and the pure-Python BERT tokenizer, which shares no code with the `tokenizers` library
    legacy = python_bert_tokenizer()(str(tmp_path / "vocab.txt"), **{"do_lower_case": True, **options})
    assert_same_ids(ours, legacy, TEXTS + ["[MASK] stays whole", "a [SEP] b"])
    pair = ours.encode(*PAIR)
    assert pair.segment_ids == legacy(*PAIR, return_token_type_ids=True)["token_type_ids"]
    assert set(pair.segment_ids) == {0, 1}
    assert ours.encode("supercalifragilistic" * 6).ids == [ours.cls_id, ours.unk_id, ours.sep_id]
    assert ours.encode("").ids == [ours.cls_id, ours.sep_id]


def test_added_tokens_json_gives_its_tokens_their_ids(bert_vocab, tmp_path):
    """added_tokens.json beside vocab.txt (save_pretrained writes it) adds its tokens at its ids, as
    BertTokenizer does: they were split into [UNK]s, and the vocabulary was short of the model's."""
    from transformers import BertTokenizer

    folder = tmp_path / "added"
    folder.mkdir()
    (folder / "vocab.txt").write_bytes(bert_vocab.read_bytes())
    n = len(lmforge.load_tokenizer(folder))
    (folder / "added_tokens.json").write_text(json.dumps({"NewWord": n, "[E1]": n + 1}))
    (folder / "special_tokens_map.json").write_text(json.dumps({"additional_special_tokens": ["[E1]"]}))
    ours, reference = lmforge.load_tokenizer(folder), BertTokenizer.from_pretrained(folder)
    text = "the NewWord newword [E1] x[E1]y"
    assert ours.encode(text).ids == reference(text)["input_ids"] and ours.vocab_size == n + 2
    assert ours.encode("newword").ids[1:-1] == [n] and "[E1]" not in ours.decode(ours.encode(text).ids)
    (folder / "added_tokens.json").write_text(json.dumps({"NewWord": n + 5}))
    with pytest.raises(TokenizerError, match="added_tokens.json: 'NewWord' has id"):
        lmforge.load_tokenizer(folder)
    (folder / "added_tokens.json").write_text(json.dumps({"NewWord": "7"}))
    with pytest.raises(TokenizerError, match="added_tokens.json: the id of 'NewWord'"):
        lmforge.load_tokenizer(folder)


def test_wordpiece_special_ids_and_decode(bert_vocab):
    tok = lmforge.load_tokenizer(bert_vocab.parent)
    ids = [tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id]
    assert ids == [0, 1, 2, 3, 4] and tok.bos_id is None and tok.eos_id is None
    assert tok.vocab_size == len(bert_vocab.read_text(encoding="utf-8").splitlines()) == len(tok)
    assert tok.decode(tok.encode("The lazy dog.").ids) == "the lazy dog."
    assert tok.tokenize("[MASK] fox")[:3] == ["[CLS]", "[MASK]", "fox"]


# ---------------------------------------------------------------- byte-level BPE (GPT-2, RoBERTa)

def write_bpe(path, specials):
    """A small byte-level BPE trained on CORPUS, saved as vocab.json + merges.txt."""
    backend = Backend(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.train_from_iterator(CORPUS, trainers.BpeTrainer(
        vocab_size=400, special_tokens=specials, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    backend.model.save(str(path))
    return path


def test_gpt2_bpe_matches_gpt2_tokenizer(tmp_path):
    from transformers import GPT2Tokenizer

    ours = lmforge.load_tokenizer(write_bpe(tmp_path, ["<|endoftext|>"]))
    reference = GPT2Tokenizer.from_pretrained(tmp_path)
    assert_same_ids(ours, reference, TEXTS + ["end<|endoftext|>start", "x" * 300])
    assert ours.encode("").ids == [] and ours.bos_id == ours.eos_id == 0 and ours.pad_id is None
    for text in TEXTS:  # byte-level BPE is lossless
        assert ours.decode(ours.encode(text).ids) == text
    with pytest.raises(ValueError, match="no pad token"):
        ours.encode_batch(["a", "a longer text"])
    ours.special_tokens["pad"] = ours.special_tokens["eos"]
    assert ours.encode_batch(["a", "a longer text"]).input_ids[0, -1] == ours.eos_id


ROBERTA_CONFIG = {"tokenizer_class": "RobertaTokenizer",
                  "mask_token": {"content": "<mask>", "lstrip": True, "rstrip": False, "normalized": False,
                                 "single_word": False, "special": True, "__type": "AddedToken"}}


@pytest.mark.parametrize("config_file", ["tokenizer_config.json", "special_tokens_map.json"])
def test_roberta_bpe_matches_roberta_tokenizer(tmp_path, config_file):
    from transformers import RobertaTokenizer

    write_bpe(tmp_path, ["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    # told apart from GPT-2 by the tokenizer class, or by the cls and sep tokens of the map
    config = ROBERTA_CONFIG if config_file == "tokenizer_config.json" else {
        "cls_token": "<s>", "sep_token": "</s>", "mask_token": ROBERTA_CONFIG["mask_token"]}
    (tmp_path / config_file).write_text(json.dumps(config))
    ours = lmforge.load_tokenizer(tmp_path)
    reference = RobertaTokenizer.from_pretrained(tmp_path)
    assert_same_ids(ours, reference, TEXTS + ["The <mask> fox"])
    a, b = (ours.encode(t, add_special_tokens=False).ids for t in PAIR)
    assert ours.encode(*PAIR).ids == [0, *a, 2, 2, *b, 2] and set(ours.encode(*PAIR).segment_ids) == {0}
    assert (ours.cls_id, ours.sep_id, ours.pad_id, ours.mask_id, ours.unk_id) == (0, 2, 1, 4, 3)


@pytest.mark.parametrize("prefix", [False, True])
def test_roberta_offsets_match_roberta_tokenizer(tmp_path, prefix):
    """A word's offsets leave out the space before it, as Hugging Face's (a span answer began with it)."""
    from transformers import RobertaTokenizer

    write_bpe(tmp_path, ["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    config = {**ROBERTA_CONFIG, "add_prefix_space": prefix}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    ours, reference = lmforge.load_tokenizer(tmp_path), RobertaTokenizer.from_pretrained(tmp_path)
    for text in TEXTS + [" ", "Héllo wörld!"]:
        want = reference(text, return_offsets_mapping=True)
        assert ours.encode(text).ids == want["input_ids"], text
        assert ours.encode(text).offsets == [tuple(o) for o in want["offset_mapping"]], text
    text = "the quick brown fox"
    assert all(not text[a:b].startswith(" ") for a, b in ours.encode(text).offsets)


# ---------------------------------------------------------------- the wrapper

def test_save_round_trip_and_transformers_reads_it(bert_vocab, tmp_path):
    from transformers import AutoTokenizer

    tok = lmforge.load_tokenizer(bert_vocab.parent)
    tok.save(tmp_path)
    back = lmforge.load_tokenizer(tmp_path)
    assert back.special_tokens == tok.special_tokens and back.vocab_size == tok.vocab_size
    assert_same_ids(back, lambda *t: {"input_ids": tok.encode(*t).ids})
    assert_same_ids(back, AutoTokenizer.from_pretrained(tmp_path))
    (tmp_path / "tokenizer_config.json").unlink()  # saved files go missing: refused, naming the record
    with pytest.raises(lmforge.tokenizer.TokenizerError, match="tokenizer_config.json: missing .listed in"):
        lmforge.load_tokenizer(tmp_path)
    (tmp_path / "sha256.json").unlink()  # a bare tokenizer.json: roles from the token names
    assert lmforge.load_tokenizer(tmp_path).special_tokens == tok.special_tokens


def test_encode_batch_pads_and_truncates(bert_vocab):
    tok = lmforge.load_tokenizer(bert_vocab.parent)
    batch = tok.encode_batch(TEXTS)
    lengths = [len(tok.encode(t)) for t in TEXTS]
    assert batch.input_ids.shape == (len(TEXTS), max(lengths)) and batch.input_ids.dtype == torch.long
    assert batch.attention_mask.sum(1).tolist() == lengths
    assert (batch.input_ids[batch.attention_mask == 0] == tok.pad_id).all()
    short = tok.encode_batch(TEXTS, max_length=6)
    assert short.input_ids.shape == (len(TEXTS), 6) and (short.input_ids[:, 0] == tok.cls_id).all()
    assert short.input_ids[0, -1] == tok.sep_id  # truncation keeps the template
    fixed = tok.encode_batch(["a", "b c"], max_length=10, padding="max_length")
    assert fixed.input_ids.shape == (2, 10)
    pairs = tok.encode_batch([PAIR[0], "x"], pairs=[PAIR[1], "y z"], max_length=12)
    assert pairs.input_ids.shape[1] == 12 and pairs.segment_ids[1].tolist()[:6] == [0, 0, 0, 1, 1, 1]
    assert tok.encode(*PAIR, max_length=9).ids[-1] == tok.sep_id and len(tok.encode(*PAIR, max_length=9)) == 9


def test_threads_sharing_a_tokenizer_never_see_another_calls_truncation_nor_wait_on_another_tokenizer(
        bert_vocab):
    import threading

    shared, own = (lmforge.load_tokenizer(bert_vocab.parent) for _ in range(2))
    text, lengths = " ".join(CORPUS[:3]), []
    full = len(shared.encode(text))

    def truncating():
        for _ in range(200):
            shared.encode(text, max_length=6)

    thread = threading.Thread(target=truncating)
    thread.start()
    for _ in range(200):
        lengths.append(len(shared.encode(text)))
    thread.join(30)
    assert set(lengths) == {full} and full > 6  # never cut by the other thread's max_length
    with shared._truncation:  # a call on `shared` under way: one on its own tokenizer goes on
        done = threading.Thread(target=lambda: lengths.append(len(own.encode(text, max_length=6))))
        done.start()
        done.join(10)
        assert not done.is_alive() and lengths[-1] == 6


def test_bad_text_input(bert_vocab):
    tok = lmforge.load_tokenizer(bert_vocab.parent)
    assert tok.encode("café".encode()).ids == tok.encode("café").ids  # UTF-8 bytes are fine
    with pytest.raises(lmforge.OptionsError, match="not valid Unicode: byte 0xe9 is not UTF-8 at position 3"):
        tok.encode(b"caf\xe9")
    with pytest.raises(lmforge.OptionsError, match="pair is not valid Unicode"):
        tok.encode("ok", "bad \udc80 surrogate")
    with pytest.raises(lmforge.OptionsError, match="a text or UTF-8 bytes"):
        tok.encode(42)
    with pytest.raises(ValueError, match="max_length=2 leaves no room"):
        tok.encode("a b c", max_length=2)
    with pytest.raises(ValueError, match="padding="):
        tok.encode_batch(["a"], padding="right")


@pytest.mark.parametrize("call, field, said", [
    (lambda tok: tok.encode(5), "text", "text must be a text or UTF-8 bytes, got int"),
    (lambda tok: tok.encode("a \ud800"), "text",
     "text is not valid Unicode: surrogates not allowed at position 2"),
    (lambda tok: tok.tokenize("a", ["b"]), "pair", "pair must be a text or UTF-8 bytes, got list"),
    (lambda tok: tok.encode_batch(["a", None]), "texts",
     "texts[1] must be a text or UTF-8 bytes, got NoneType"),
    (lambda tok: tok.encode_batch(["a", "b"], ["c", "\udc80"]), "pairs", "pairs[1] is not valid Unicode"),
])
def test_a_bad_text_is_an_options_error_naming_its_field(bert_vocab, call, field, said):
    """checked_text's rule and wording (embed's and fill-mask's): text=5 was a TypeError and a lone
    surrogate a ValueError "not valid UTF-8", neither an OptionsError nor naming the field (nor which text of
    a batch)."""
    tok = lmforge.load_tokenizer(bert_vocab.parent)
    with pytest.raises(lmforge.OptionsError, match=re.escape(said)) as refused:
        call(tok)
    assert refused.value.field == field and "\n" not in str(refused.value)


def test_unreadable_directories(tmp_path):
    with pytest.raises(TokenizerError, match="is neither a model directory nor a known model package"):
        lmforge.load_tokenizer(tmp_path / "nope")
    with pytest.raises(TokenizerError, match="is empty"):
        lmforge.load_tokenizer(tmp_path)
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(TokenizerError, match=r"no tokenizer files \(looked for .*found: config"):
        lmforge.load_tokenizer(tmp_path)
    (tmp_path / "vocab.json").write_text("{}")
    with pytest.raises(TokenizerError, match="no merges.txt"):
        lmforge.load_tokenizer(tmp_path)
    (tmp_path / "merges.txt").write_text("#version: 0.2\n")  # encoded "hello" as [] where it loaded
    with pytest.raises(TokenizerError, match="vocab.json lacks 256 of the 256 byte tokens"):
        lmforge.load_tokenizer(tmp_path)
    (tmp_path / "merges.txt").unlink()
    (tmp_path / "tokenizer_config.json").write_text("{not json")
    with pytest.raises(TokenizerError, match="tokenizer_config.json is not valid JSON"):
        lmforge.load_tokenizer(tmp_path)
    (tmp_path / "tokenizer_config.json").unlink()
    (tmp_path / "tokenizer.json").write_text("{}")
    with pytest.raises(TokenizerError, match="cannot read .*tokenizer.json"):
        lmforge.load_tokenizer(tmp_path)
    empty = tmp_path / "wordpiece"
    empty.mkdir()
    (empty / "vocab.txt").write_text("\n")  # loaded as its 5 special tokens alone: every word [UNK]
    with pytest.raises(TokenizerError, match="vocab.txt holds no tokens"):
        lmforge.load_tokenizer(empty)


@pytest.mark.parametrize("key, value, said", [
    ("do_lower_case", "false", "true or false"), ("strip_accents", 1, "true or false"),  # bool() took "false"
    ("tokenize_chinese_chars", [], "true or false"), ("max_input_chars_per_word", 1.5, "an integer in"),
    ("max_input_chars_per_word", -1, "an integer in"), ("extra_ids", 10 ** 12, "an integer in [0, 65536]"),
    ("additional_special_tokens", "<x>", "a list of tokens"),  # a string: one token per character
    ("pad_token", 5, "a token (a string or"), ("mask_token", ["[MASK]"], "a token"),  # the role was dropped
    ("cls_token", {"text": "[CLS]"}, "a token (a string or {\"content\": ...}) or null")])
def test_a_config_setting_of_the_wrong_kind_is_named(bert_vocab, tmp_path, key, value, said):
    """It was a TypeError or OverflowError of the tokenizers library, or extra_ids=1e12 filling the memory."""
    (tmp_path / "vocab.txt").write_bytes(bert_vocab.read_bytes())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({key: value}))
    said = rf"^{re.escape(str(tmp_path))}: the tokenizer config's {key} must be {re.escape(said)}"
    with pytest.raises(TokenizerError, match=said):
        lmforge.load_tokenizer(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({key: None}))  # null: the default
    assert lmforge.load_tokenizer(tmp_path).encode("The lazy dog.").ids


@pytest.mark.parametrize("value, limit", [(True, None), (16, 16), (-1, None), (10 ** 30, None)])
def test_model_max_length_is_a_whole_positive_count_or_none(bert_vocab, tmp_path, value, limit):
    """model_max_length: true was read as 1 (a bool is an int): embed then cut every text to one token."""
    (tmp_path / "vocab.txt").write_bytes(bert_vocab.read_bytes())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"model_max_length": value}))
    assert lmforge.load_tokenizer(tmp_path).model_max_length == limit
