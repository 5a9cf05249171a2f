"""Tokenizer.save refuses what model.save refuses (an empty name, a symbolic link, a file as its folder),
with the same exception naming the path, and never writes where a link points."""
import pytest

import lmforge
from lmforge.config.options import OptionsError
from lmforge.utils.atomic import UnsafePath  # an OptionsError, as every link refusal is
from tests.tasks.core import tiny, tokenizer


def _plant(tmp_path, dangling: bool):
    target = tmp_path / "elsewhere"
    if not dangling:
        target.mkdir()
    (tmp_path / "tok").symlink_to(target, target_is_directory=True)
    return target


@pytest.mark.parametrize("dangling", [False, True])
def test_a_link_as_the_folder_is_refused_naming_it_as_model_save_refuses_it(tmp_path, dangling):
    target = _plant(tmp_path, dangling)
    said = f"^path {tmp_path / 'tok'}: is a symbolic link; a tokenizer directory is never written through one"
    with pytest.raises(UnsafePath, match=said) as err:
        tokenizer().save(tmp_path / "tok")
    assert err.value.field == "path" and "\n" not in str(err.value) and isinstance(err.value, OptionsError)
    assert (list(target.iterdir()) == []) if not dangling else not target.exists()
    with pytest.raises(UnsafePath, match="is a symbolic link; a model directory is never written through"):
        lmforge.save(tiny(), tmp_path / "tok")  # the same refusal for the model beside it


def test_an_empty_name_or_a_file_is_refused_naming_it_and_a_folder_is_written(tmp_path):
    with pytest.raises(OptionsError, match="^path is empty: name the tokenizer directory"):
        tokenizer().save("")
    (tmp_path / "file").write_text("the user's")
    with pytest.raises(OptionsError, match=f"^path {tmp_path / 'file'}: exists and is not a folder"):
        tokenizer().save(tmp_path / "file")
    assert (tmp_path / "file").read_text() == "the user's"
    saved = tokenizer().save(tmp_path / "new" / "tok")
    assert sorted(p.name for p in saved.iterdir()) == ["sha256.json", "tokenizer.json",
                                                       "tokenizer_config.json"]


@pytest.mark.parametrize("damage", ["vocab", "delete-config"])
def test_a_tokenizer_saved_beside_a_model_is_verified_when_read(tmp_path, capsys, damage):
    """One flipped bit in a vocabulary entry (still JSON) tokenized otherwise unsaid, and a lost
    tokenizer_config.json (its special tokens) went unnoticed (helper's probe). Beside a model the checksums
    are in its config.json (one record: no sha256.json there); a tokenizer folder of its own keeps them in
    sha256.json, and is refused alike."""
    from lmforge.cli import main
    from lmforge.tokenizer import TokenizerError, load_tokenizer

    lmforge.save(tiny(), tmp_path / "m")
    tokenizer().save(tmp_path / "m")
    tokenizer().save(tmp_path / "alone")
    for folder in ("m", "alone"):
        text = (tmp_path / folder / "tokenizer.json").read_text()
        if damage == "vocab":
            vocab = load_tokenizer(tmp_path / folder).backend.get_vocab()
            word = next(w for w in vocab if w.isalpha() and len(w) > 3)
            assert f'"{word}":' in text
            edited = text.replace(f'"{word}":', f'"{word[:-1]}#":', 1)
            (tmp_path / folder / "tokenizer.json").write_text(edited)
        else:
            (tmp_path / folder / "tokenizer_config.json").unlink()
    name = "tokenizer.json" if damage == "vocab" else "tokenizer_config.json"
    assert not (tmp_path / "m" / "sha256.json").exists()
    for folder, record in (("m", "config.json"), ("alone", "sha256.json")):
        with pytest.raises(TokenizerError) as refused:
            load_tokenizer(tmp_path / folder)
        said = str(refused.value)
        assert said.startswith(str(tmp_path / folder / name)) and record in said and "\n" not in said
    assert main(["embed", "--model", str(tmp_path / "m"), "a text"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and str(tmp_path / "m" / name) in err, err


def test_a_tokenizer_alone_keeps_signed_checksums_that_are_checked_themselves(tmp_path):
    """sha256.json carries its own checksum: an edited record is refused naming it, not trusted (a folder in
    its place was skipped: the files read unverified); a folder without one (Hugging Face's, or written
    before) reads unverified, as it always did."""
    import json

    from lmforge.tokenizer import TokenizerError, load_tokenizer

    folder = tokenizer().save(tmp_path / "alone")
    load_tokenizer(folder)
    record = json.loads((folder / "sha256.json").read_text())
    assert set(record) == {"tokenizer.json", "tokenizer_config.json", "checksum"}
    (folder / "sha256.json").write_text(json.dumps({**record, "tokenizer.json": "0" * 64}))
    with pytest.raises(TokenizerError, match=f"^{folder / 'sha256.json'}: does not match its checksum"):
        load_tokenizer(folder)
    (folder / "sha256.json").write_text("{")
    with pytest.raises(TokenizerError, match=f"^{folder / 'sha256.json'}: not readable JSON"):
        load_tokenizer(folder)
    (folder / "sha256.json").unlink()
    (folder / "sha256.json").mkdir()  # a folder (or a dangling link) as the record: damaged, not skipped
    with pytest.raises(TokenizerError, match=f"^{folder / 'sha256.json'}: not a file of checksums"):
        load_tokenizer(folder)
    (folder / "sha256.json").rmdir()
    (folder / "sha256.json").symlink_to(tmp_path / "gone.json")
    with pytest.raises(TokenizerError, match=f"^{folder / 'sha256.json'}: not a file of checksums"):
        load_tokenizer(folder)
    (folder / "sha256.json").unlink()
    assert load_tokenizer(folder).vocab_size == tokenizer().vocab_size


def test_max_length_is_a_whole_count_and_padding_to_it_is_bounded():
    from lmforge.tokenizer import train_tokenizer

    tok = train_tokenizer(["the cat sat on the mat"] * 5, "wordpiece", 60)
    assert tok.encode_batch(["the cat"], max_length=6.0, padding="max_length").input_ids.shape == (1, 6)
    # padding to 10**12 asked the allocator for 8 TB; 2.5 was a TypeError, True a length of 1
    for bad, padding in ((10**12, "max_length"), (2.5, "longest"), (True, "longest")):
        with pytest.raises(OptionsError, match="max_length must be an integer") as err:
            tok.encode_batch(["the cat"], max_length=bad, padding=padding)
        assert err.value.field == "max_length"
    assert tok.encode_batch(["the cat"], max_length=10**12).input_ids.shape == (1, 4)  # cuts nothing


def test_a_max_length_past_the_backends_count_is_refused_naming_it():
    from lmforge.tokenizer import train_tokenizer

    tok = train_tokenizer(["the cat sat on the mat"] * 5, "wordpiece", 60)
    assert len(tok.encode("the cat", max_length=2 ** 63 - 1).ids) == 4  # the most it takes: cuts nothing
    for call in (lambda: tok.encode("the cat", max_length=2 ** 64),  # an OverflowError naming nothing
                 lambda: tok.encode_batch(["the cat"], max_length=10 ** 30)):
        with pytest.raises(OptionsError, match="^max_length must be an integer <= 922337203685477580") as err:
            call()
        assert err.value.field == "max_length"


def test_decode_names_what_is_no_token_id():
    import numpy as np
    import torch

    from lmforge.tokenizer import train_tokenizer

    tok = train_tokenizer(["the cat sat on the mat"] * 5, "wordpiece", 60)
    ids = tok.encode("the cat", add_special_tokens=False).ids
    assert tok.decode(torch.tensor(ids)) == tok.decode(np.array(ids)) == tok.decode(ids) == "the cat"
    # were an OverflowError, or the backend's TypeError ("'list' object cannot be interpreted ...")
    for bad in ([-1], [2**40], [1.0], [True], torch.tensor([ids])):
        with pytest.raises(ValueError, match="decode takes one sequence of token ids"):
            tok.decode(bad)
        with pytest.raises(ValueError, match="word_starts takes one sequence of token ids"):
            tok.word_starts(bad)  # [-1] was the backend's OverflowError
    assert tok.word_starts(np.array(ids)) == tok.word_starts(ids) == [True, True]


def test_an_encoding_says_whether_max_length_cut_it():
    """Fine-tuning counts the records it cut from this flag (it had encoded every full-length text twice)."""
    from tests.tasks.core import tokenizer

    tok = tokenizer("bert")
    text = "the film was long and the actors were good"
    assert tok.encode(text, max_length=8).truncated and not tok.encode(text).truncated
    assert not tok.encode("a cat", max_length=8).truncated
    assert tok.encode("the film", "was long and the actors good", max_length=8).truncated


@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_a_saved_tokenizer_gives_the_reference_the_segment_ids_of_a_pair(tmp_path, family):
    """transformers 5 reads a tokenizer_config.json without model_input_names as giving no token_type_ids:
    an exported BERT cross-encoder scored every pair as one segment (sentence-transformers differed)."""
    transformers = pytest.importorskip("transformers")
    from lmforge.tokenizer import train_tokenizer

    model = "wordpiece" if family == "bert" else "bpe"
    tok = train_tokenizer(["the cat sat on the mat", "a dog ran"] * 5, model, 80, family=family)
    tok.save(tmp_path)
    reference = transformers.AutoTokenizer.from_pretrained(tmp_path)("the cat", "a dog")
    ours = tok.encode("the cat", "a dog")
    assert reference["input_ids"] == ours.ids
    assert reference.get("token_type_ids", [0] * len(ours.ids)) == ours.segment_ids
    assert ("token_type_ids" in reference) == (family == "bert")


@pytest.mark.parametrize("preset, named", [("bert-base", True), ("bart-base", False)])
def test_token_type_ids_are_named_only_for_a_model_with_segments(tmp_path, preset, named):
    """A BART over a BERT vocabulary (RAG's generator) has no segment embeddings: the reference's generate
    refuses token_type_ids it is given."""
    import json

    import lmforge
    from lmforge.tokenizer import train_tokenizer

    tok = train_tokenizer(["the cat sat on the mat", "a dog ran"] * 5, "wordpiece", 80)
    lmforge.build(lmforge.tiny(preset), vocab_size=tok.vocab_size).save(tmp_path)
    tok.save(tmp_path)
    names = json.loads((tmp_path / "tokenizer_config.json").read_text())["model_input_names"]
    assert ("token_type_ids" in names) == named


def test_a_tokenizer_loaded_back_saves_the_same_bytes(tmp_path):
    """A T5 tokenizer trained with its roles in the trainer's order (pad, eos, unk) was loaded back in ROLES'
    order: a resumed run's final/tokenizer_config.json differed from the run straight through's."""
    from lmforge.tokenizer import Tokenizer, load_tokenizer
    from lmforge.tokenizer.train import train_tokenizer

    trained = train_tokenizer(["the cat sat on the mat", "a dog ran far"] * 20, "unigram", 60)
    reordered = Tokenizer(trained.backend, dict(reversed(list(trained.special_tokens.items()))))
    trained.save(tmp_path / "a")
    reordered.save(tmp_path / "b")
    load_tokenizer(tmp_path / "a").save(tmp_path / "c")
    texts = [(tmp_path / f / "tokenizer_config.json").read_bytes() for f in "abc"]
    assert texts[0] == texts[1] == texts[2]
