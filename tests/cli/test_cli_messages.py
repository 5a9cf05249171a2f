"""The command line's one-line refusals name their flag once, a mistyped flag is refused by its own
sub-command (with the closest flag), and a run folder read as its final/ is said on standard error."""
import json
import shutil

import pytest
import torch

import lmforge
from lmforge.cli import main
from lmforge.tokenizer import train_tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

TEXTS = [f"the {a} {b} sat on the {c}" for a in ("small", "red", "old") for b in ("cat", "dog", "fox")
         for c in ("mat", "hill")]


def saved(path, preset: str, kind: str, family: str) -> str:
    """A tiny random model of `preset` with a tokenizer trained on TEXTS, saved to `path`."""
    tok = train_tokenizer(TEXTS, kind, 120, family=family)
    torch.manual_seed(0)
    lmforge.build(lmforge.tiny(preset, vocab_size=tok.vocab_size, max_seq_len=64)).save(path)
    tok.save(path)
    return str(path)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """(a tiny BERT directory, a tiny GPT-2 directory)."""
    return (saved(tmp_path_factory.mktemp("bert"), "bert-base", "wordpiece", "bert"),
            saved(tmp_path_factory.mktemp("gpt"), "gpt2", "bpe", "gpt2"))


def refused(argv, capsys) -> str:
    """The one line a refused command prints (exit status 2)."""
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


@pytest.mark.parametrize("argv, said", [
    (["embed", "--model", "x", "--modle", "y", "a"],
     ("lmforge embed: error: unrecognized arguments: --modle; did you mean --model? (see lmforge embed "
      "--help)")),
    (["corpus", "shard", "--tokenizer", "t", "--out", "o", "--tokenizr", "t", "f"],
     "lmforge corpus shard: error: unrecognized arguments: --tokenizr; did you mean --tokenizer?"),
    (["retrieve", "train", "--out", "o", "--modl", "m"], ("lmforge retrieve train: error: unrecognized "
     "arguments: --modl; did you mean --model? (see lmforge retrieve train --help)")),
    (["index", "build", "--out", "o", "--zzz", "1"],
     "lmforge index build: error: unrecognized arguments: --zzz (see lmforge index build --help)"),
    # before the sub-command: lmforge's own, not the sub-command's
    (["--bogus", "presets"], "lmforge: error: unrecognized arguments: --bogus (see lmforge --help)"),
    (["presets", "--bogus"],
     "lmforge presets: error: unrecognized arguments: --bogus (see lmforge presets --help)"),
])
def test_an_unknown_flag_is_refused_by_its_own_sub_command(argv, said, capsys):
    with pytest.raises(SystemExit) as ended:
        main(argv)
    assert ended.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(said), err


def test_a_run_folder_read_as_its_final_is_said_once(models, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(models[0], run / "final")
    assert main(["embed", "--model", str(run), "the cat"]) == 0
    captured = capsys.readouterr()
    note = captured.err.strip().splitlines()
    assert note == [(f"lmforge embed: note: --model {run} is a run folder: reading {run / 'final'} (its last "
                     "step's model)")]
    assert json.loads(captured.out.splitlines()[0])  # standard output as it was: the JSON lines
    shutil.copytree(models[0], run / "best")
    assert main(["embed", "--model", str(run), "the cat"]) == 0
    (note,) = capsys.readouterr().err.strip().splitlines()
    assert f"{run / 'best'} holds the best validation score's model" in note
    assert main(["embed", "--model", str(run / "best"), "the cat"]) == 0
    assert capsys.readouterr().err == ""  # a model folder itself: nothing to say


def test_a_job_folder_read_as_its_model_is_not_said_to_be_read_as_final(models, tmp_path, capsys):
    """The loaders read a job folder's model/ before its final/ (utils/model_folder.py): the note, which
    names final/, is not said where model/ is read."""
    run = tmp_path / "run"
    for sub in ("model", "final"):
        shutil.copytree(models[0], run / sub)
    assert main(["embed", "--model", str(run), "the cat"]) == 0
    assert capsys.readouterr().err == ""


def test_bad_outputs_are_refused(models, tmp_path, capsys):
    bert = models[0]
    err = refused(["attention", "--model", bert, "the cat", "--out", str(tmp_path / "view.png")], capsys)
    assert "--out" in err and ".html" in err and "--png" in err
    err = refused(["embed", "--model", bert, "--out", str(tmp_path / "vectors.txt"), "the cat"], capsys)
    assert "--out" in err and "a .npy file or a folder" in err and not (tmp_path / "vectors.txt").exists()
    with pytest.raises(SystemExit):
        main(["embed", "--help"])
    assert "a .npy file" in " ".join(capsys.readouterr().out.split())


def test_errors_name_their_flag_once(models, tmp_path, capsys):
    bert, gpt = models
    (tmp_path / "mk.py").write_text("")
    data = tmp_path / "c.jsonl"
    data.write_text('{"body": "the cat sat"}\n{"body": "the dog sat"}\n')
    for argv, said in (
            (["pretrain", "--preset", "gpt2", "--objective", "clm", "--data", str(data), "--tokenizer",
              "nope", "--out", str(tmp_path / "p")], "--tokenizer nope: no such folder"),
            (["corpus", "shard", "--tokenizer", "nope", "--out", str(tmp_path / "s"), str(data)],
             "--tokenizer nope: no such folder"),
            (["corpus", "shard", "--tokenizer", str(tmp_path / "mk.py"), "--out", str(tmp_path / "s"),
              str(data)], "mk.py: is a file, not a folder"),
            (["retrieve", "train", "--model", gpt, "--out", str(tmp_path / "r"), "--steps", "1"],
             f"--model {gpt}: a DPR encoder must be an encoder model, not decoder"),
            (["index", "build", "--model", gpt, "--out", str(tmp_path / "i")],
             f"--model {gpt}: a DPR encoder must be an encoder model, not decoder"),
            (["features", "--model", bert, "--layers", "5", "--text", "the cat", "--out",
              str(tmp_path / "f")], "error: --layers '5': outside 0..2"),
            (["features", "--model", bert, "--text", "", "--out", str(tmp_path / "f")], "--text: the text"),
            (["pretrain", "--preset", "gpt2", "--objective", "clm", "--data", str(data), "--tokenizer", gpt,
              "--out", str(tmp_path / "p")], (f"--data {data}: no record has a string \"text\" field (its "
                                              "records' fields: body): give --text-field")),
            (["index", "build", "--passages", str(data), "--out", str(tmp_path / "i")],
             f"--passages {data}: no record has a string \"text\" field (its records' fields: body)"),
            (["retrieve", "rag", "--retriever", bert, "--generator", "bart-tinyy", "--out",
              str(tmp_path / "g")], "; or a preset: bart-small, bart-tiny (did you mean bart-tiny?)")):
        err = refused(argv, capsys)
        flag = err.split(": error: ", 1)[1].split()[0].rstrip(":")  # the flag the line opens with
        assert said in err and flag.startswith("--") and err.count(flag) == 1, err  # named once
    assert not any((tmp_path / name).exists() for name in "psrifg")


def test_distill_synopsis_says_one_of_valid_and_data_is_required(capsys):
    with pytest.raises(SystemExit):
        main(["distill", "--help"])
    assert "(--valid VALID and/or --data DATA)" in " ".join(capsys.readouterr().out.split())
