"""`lmforge tokenizer train` puts tokenizer.json and tokenizer_config.json in place together: a run that
fails writing the second leaves the folder as it was, never a new tokenizer.json that loads with the
wrong special tokens."""
import lmforge.tokenizer.wrapper as wrapper
from tests.faces import cli_verdict


def test_a_run_that_fails_writing_its_config_leaves_the_folder_as_it_was(tmp_path, monkeypatch):
    text, out = tmp_path / "t.txt", tmp_path / "tok"
    text.write_text("the cat sat on the mat .\nthe dog ran in the park .\n" * 20)
    out.mkdir()
    (out / "tokenizer.json").write_text("an earlier tokenizer")
    written = wrapper.atomic_write_text

    def disk_full_at_the_config(path, data):
        if path.name == "tokenizer_config.json":
            raise OSError(28, "No space left on device", str(path))
        return written(path, data)

    monkeypatch.setattr(wrapper, "atomic_write_text", disk_full_at_the_config)
    line = cli_verdict(["tokenizer", "train", "--kind", "wordpiece", "--vocab-size", "60", str(text)],
                       {"out": out})
    assert line is not None and f"No space left on device: '{out / 'tokenizer_config.json'}'" in line, line
    assert [p.name for p in out.iterdir()] == ["tokenizer.json"]
    assert (out / "tokenizer.json").read_text() == "an earlier tokenizer"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.txt", "tok"]  # nothing left beside it


def test_a_tokenizer_trained_into_a_model_folder_is_recorded_there_and_loads(tmp_path):
    """The files went in through a staging folder with no model config, so the model's config.json kept the
    old tokenizer's checksums and refused the new one as changed."""
    import lmforge
    from tests.serve.conftest import _save, _tiny, _tokenizer

    old = _tokenizer("bert")
    _save(_tiny("bert-base", old, 3, max_seq_len=32), old, tmp_path / "m")
    assert cli_verdict(["tokenizer", "train", "--kind", "wordpiece", "--vocab-size", "120"],
                       {"out": tmp_path / "m", "docs": 50}) is None
    assert lmforge.load_tokenizer(tmp_path / "m").vocab_size == 120


def test_an_out_holding_an_input_file_is_refused_naming_both_before_training(tmp_path):
    """`tokenizer train data/c.txt --out data` put tokenizer.json beside the text: a later `corpus shard data`
    read the tokenizer's JSON files as corpus text."""
    (tmp_path / "data").mkdir()
    text = tmp_path / "data" / "c.txt"
    text.write_text("the cat sat on the mat .\nthe dog ran in the park .\n" * 20)
    for out in (tmp_path / "data", tmp_path):
        line = cli_verdict(["tokenizer", "train", "--kind", "wordpiece", "--vocab-size", "60", str(text)],
                           {"out": out})
        assert line is not None and f"FILES {text} lies inside --out {out}" in line, line
    assert [p.name for p in (tmp_path / "data").iterdir()] == ["c.txt"]
