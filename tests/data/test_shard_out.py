"""data/shard_out: what a shard run is given (a tokenizer, read options) and where it may write (an out
apart from its inputs, never over a tokenizer folder of the user's), alike for the command and Python."""
import pytest

from lmforge.data.shards import shard_corpus
from lmforge.tokenizer import load_tokenizer


def test_the_python_face_refuses_an_out_among_the_inputs_as_the_command_does(corpus_dir, tokenizer_dir,
                                                                             tmp_path):
    """shard_corpus wrote its shards into the folder of its input file (the command refused it), and an out
    that is the input file itself was a FileExistsError from mkdir."""
    from lmforge.utils.atomic import UnsafePath

    (tmp_path / "c").mkdir()
    text = tmp_path / "c" / "a.txt"
    text.write_text((corpus_dir / "c.txt").read_text())
    for given, out in ((text, tmp_path / "c"), (text, text), (tmp_path / "c", tmp_path / "c" / "sh"),
                       (tmp_path / "c", tmp_path)):
        with pytest.raises(UnsafePath, match=f"^out {out} is, holds or lies inside the input {given}") as no:
            shard_corpus([given], tokenizer_dir, out, log=lambda m: None)
        assert no.value.field == "out"
    assert sorted(p.name for p in (tmp_path / "c").iterdir()) == ["a.txt"]  # nothing written


def test_a_tokenizer_folder_of_the_users_in_out_is_refused_never_replaced(corpus_dir, tokenizer_dir,
                                                                         tmp_path):
    """out/tokenizer is replaced whole: a folder of the user's of that name (notes.txt in it) went unsaid."""
    from lmforge.utils.atomic import UnsafePath

    out = tmp_path / "work"
    (out / "tokenizer").mkdir(parents=True)
    (out / "tokenizer" / "notes.txt").write_text("precious\n")
    with pytest.raises(UnsafePath, match=f"^out {out}: its tokenizer holds notes.txt, not only a tokenizer"):
        shard_corpus([corpus_dir / "c.txt"], tokenizer_dir, out, log=lambda m: None)
    assert (out / "tokenizer" / "notes.txt").read_text() == "precious\n" and len(list(out.iterdir())) == 1
    (out / "tokenizer" / "notes.txt").unlink()
    load_tokenizer(tokenizer_dir).save(out / "tokenizer")  # an earlier run's copy: replaced, as a rerun does
    assert shard_corpus([corpus_dir / "c.txt"], tokenizer_dir, out, log=lambda m: None)["complete"]


@pytest.mark.parametrize("field, given", [("tokenizer", None), ("tokenizer", 3),
                                          ("options", {"lower": True})])
def test_a_tokenizer_or_options_of_another_type_is_refused_naming_it_before_any_write(
        corpus_dir, tokenizer_dir, tmp_path, field, given):
    """They failed as AttributeErrors once the run had made its folder."""
    from lmforge.config.options import OptionsError

    arguments = {"tokenizer": tokenizer_dir, "options": None, field: given}
    with pytest.raises(OptionsError, match=f"^{field} must be") as no:
        shard_corpus([corpus_dir / "c.txt"], out=tmp_path / "sh", log=lambda m: None, **arguments)
    assert no.value.field == field and not (tmp_path / "sh").exists()


def test_an_out_nested_with_the_tokenizer_folder_is_refused_by_both_faces(corpus_dir, tokenizer_dir,
                                                                         tmp_path, capsys):
    """An --out inside the --tokenizer folder (or the tokenizer inside --out) was accepted: the shards and
    the run's tokenizer/ copy were written into the user's tokenizer folder."""
    import shutil

    from lmforge.cli import main
    from lmforge.utils.atomic import UnsafePath

    tok = tmp_path / "tok"
    shutil.copytree(tokenizer_dir, tok)
    before = sorted(p.name for p in tok.iterdir())
    for tokenizer, out in ((tok, tok / "sh"), (tok, tok), (tok, tmp_path)):
        argv = ["corpus", "shard", str(corpus_dir / "c.txt"), "--tokenizer", str(tokenizer),
                "--out", str(out)]
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "--out" in err and "--tokenizer" in err, err
        said = f"^out {out} is, holds or lies inside the tokenizer folder"
        with pytest.raises(UnsafePath, match=said) as no:
            shard_corpus([corpus_dir / "c.txt"], tokenizer, out, log=lambda m: None)
        assert no.value.field == "out"
    assert sorted(p.name for p in tok.iterdir()) == before  # nothing written


def test_an_out_whose_written_names_are_an_input_by_another_name_is_refused(corpus_dir, tokenizer_dir,
                                                                           tmp_path):
    """The command's rule (utils.atomic.writes_over): out/manifest.json a hard link to an input file, or
    out/tokenizer a link to the tokenizer folder, was let through by the Python face alone."""
    import os
    import shutil

    from lmforge.utils.atomic import UnsafePath

    text, tok = tmp_path / "a.txt", tmp_path / "tok"
    text.write_text((corpus_dir / "c.txt").read_text())
    shutil.copytree(tokenizer_dir, tok)
    (tmp_path / "o1").mkdir()
    os.link(text, tmp_path / "o1" / "manifest.json")
    (tmp_path / "o2").mkdir()
    (tmp_path / "o2" / "tokenizer").symlink_to(tok, target_is_directory=True)
    for out, said in ((tmp_path / "o1", f"the input {text}"),
                      (tmp_path / "o2", f"the tokenizer folder {tok}")):
        with pytest.raises(UnsafePath, match=f"^out {out} is, holds or lies inside {said}") as no:
            shard_corpus([text], tok, out, log=lambda m: None)
        assert no.value.field == "out"
    assert text.read_text() == (corpus_dir / "c.txt").read_text()
    assert len(list((tmp_path / "o1").iterdir())) == 1  # nothing written beside the link
