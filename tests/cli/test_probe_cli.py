"""`lmforge probe` and `lmforge features`: what they write, and one-line errors with exit status 2."""
import json

import pytest
import torch

import lmforge
from lmforge.analysis.features import load_features
from lmforge.cli import main
from lmforge.data.conllu import write_conllu
from lmforge.data.treebank import treebank
from lmforge.tokenizer import train_tokenizer

QUICK = ["epochs=2", "hidden=8", "rank=4", "lr=0.01"]


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny random BERT with a WordPiece tokenizer of the treebank's words, saved."""
    path = tmp_path_factory.mktemp("model")
    tok = train_tokenizer([" ".join(r["words"]) for r in treebank(200, seed=9)], "wordpiece", 400)
    torch.manual_seed(0)
    lmforge.build(lmforge.tiny("bert-base", vocab_size=tok.vocab_size, max_seq_len=128)).save(path)
    tok.save(path)
    return str(path)


def write(path, text):
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_probe_on_the_builtin_treebank_writes_json_plot_and_table(model_dir, tmp_path, capsys):
    out = tmp_path / "probe"
    assert main(["probe", "--model", model_dir, "--sentences", "60", "--out", str(out), *QUICK]) == 0
    result = json.loads((out / "probe.json").read_text())
    assert list(result["tasks"]) == ["pos", "deps", "agreement", "coref", "distance", "depth"]
    assert result["layers"] == [0, 1, 2] and result["sentences"] == {"train": 42, "dev": 9, "test": 9}
    assert "selectivity" in result["tasks"]["pos"]["mlp"] and "right_branching_uuas" in result["baselines"]
    assert set(result["summary"]["checks"]) == {"pos_expected_layer_below_long_range",
                                                "uuas_points_above_right_branching"}
    assert (out / "probe.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    printed = capsys.readouterr().out
    assert "Probing: test score per layer" in printed and "right-branching UUAS" in printed


def test_probe_on_a_conllu_file_offers_the_tasks_it_supports(model_dir, tmp_path, capsys):
    data = write_conllu(treebank(40, seed=1), tmp_path / "ud.conllu")
    out = tmp_path / "probe"
    assert main(["probe", "--model", model_dir, "--data", str(data), "--tasks", "pos,distance",
                 "--layers", "1-2", "--heads", "linear", "--no-control", "--out", str(out), *QUICK]) == 0
    strict = {"parse_constant": lambda word: pytest.fail(f"{word} is not JSON")}  # a browser's JSON.parse, jq
    result = json.loads((out / "probe.json").read_text(), **strict)
    assert list(result["tasks"]) == ["pos", "distance"] and result["layers"] == [1, 2]
    assert "control" not in result["tasks"]["pos"]["linear"]
    printed = capsys.readouterr().out
    shown = json.loads(printed[printed.index("\n{") + 1:printed.rindex("}") + 1], **strict)  # the summary
    assert result["summary"]["pos"]["selectivity"] is None and shown["pos"]["selectivity"] is None
    assert main(["probe", "--model", model_dir, "--data", str(data), "--tasks", "coref",
                 "--out", str(out)]) == 2
    assert "--tasks coref" in capsys.readouterr().err


def test_a_few_sentences_probe_what_they_hold_and_say_what_they_lack(model_dir, tmp_path, capsys):
    out = tmp_path / "probe"
    assert main(["probe", "--model", model_dir, "--sentences", "3", "--out", str(out), *QUICK]) == 0
    assert "agreement" not in json.loads((out / "probe.json").read_text())["tasks"]
    assert "lmforge probe: note: no agreement, coref probe: the 3 sentences drawn" in capsys.readouterr().err
    assert main(["probe", "--model", model_dir, "--sentences", "3", "--tasks", "coref",
                 "--out", str(tmp_path / "again")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--tasks coref" in err and "more --sentences" in err


def test_features_are_written_as_safetensors(model_dir, tmp_path):
    data = write(tmp_path / "s.txt", "the dog runs .\nJohn sees the old cats near the house .\n")
    out = tmp_path / "feats"
    assert main(["features", "--model", model_dir, "--data", data, "--layers", "1-2", "--pooling", "mean",
                 "--out", str(out)]) == 0
    features, meta = load_features(out / "features.safetensors")
    assert [tuple(f.shape) for f in features] == [(2, 4, 32), (2, 9, 32)]
    assert meta["layers"] == [1, 2] and meta["pooling"] == "mean"
    assert json.loads((out / "features.json").read_text())["sentences"] == 2


@pytest.mark.parametrize("argv, said", [(["--text", "The cat sat."], "(1 text, layers"),
                                         (["--text", "a", "--text", "b"], "(2 texts, layers"),
                                         (["--data", "{one}"], "(1 sentence, layers")])
def test_the_summary_counts_in_the_right_number(model_dir, tmp_path, capsys, argv, said):
    """One text printed "(1 texts, ...)"."""
    argv = [write(tmp_path / "s.txt", "the dog runs .\n") if a == "{one}" else a for a in argv]
    assert main(["features", "--model", model_dir, *argv, "--layers", "-1",
                 "--out", str(tmp_path / "o")]) == 0
    assert said in capsys.readouterr().out


def test_features_with_a_task_train_a_head_and_write_metrics(model_dir, tmp_path):
    conll = "\n\n".join("\n".join(f"{w} {'B-PER' if w == 'John' else 'O'}" for w in s.split())
                        for s in ["John runs .", "the dog sees John .", "John sleeps ."] * 4)
    train, dev = write(tmp_path / "train.conll", conll), write(tmp_path / "dev.conll", conll)
    out = tmp_path / "ner"
    assert main(["features", "--model", model_dir, "--task", "tagging", "--train", train, "--dev", dev,
                 "--out", str(out), "--head", "mlp", *QUICK]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["task"] == "tagging" and {"f1", "accuracy"} <= set(metrics["dev"])
    assert metrics["layers"] == [0, 1, 2] and len(metrics["mix_weights"]) == 3
    lines = "".join(json.dumps({"text": t, "label": label}) + "\n"
                    for t, label in [("the dog runs", "a"), ("John sleeps", "b")] * 5)
    texts = write(tmp_path / "t.jsonl", lines)
    assert main(["features", "--model", model_dir, "--task", "classification", "--train", texts,
                 "--dev", texts, "--out", str(tmp_path / "cls"), *QUICK]) == 0
    assert set(json.loads((tmp_path / "cls" / "metrics.json").read_text())["dev"]) == \
        {"accuracy", "f1", "matthews"}


@pytest.mark.parametrize("argv, named", [
    (["probe", "--layers", "9"], "--layers '9'"),
    (["probe", "--layers", "2-x"], "--layers '2-x'"),
    (["probe", "--data", "missing.conllu"], "--data missing.conllu: no such file"),
    (["probe", "--tasks", "pos,syntax"], "--tasks pos,syntax"),
    (["probe", "--tasks", ""], "--tasks '': names no task"),  # "" probed every task
    (["probe", "--tasks", " , "], "--tasks ' , ': names no task"),
    (["probe", "--heads", "cnn"], "--heads cnn"),
    (["probe", "--heads", "mlp,mlp"], "--heads mlp,mlp: choose from linear, mlp, each once"),
    (["probe", "--tasks", "pos,pos"], "--tasks pos,pos: a task is named twice"),  # it was probed twice
    (["probe", "--held-out", "0.7"], "--held-out 0.7"),
    (["probe", "epochs=0"], "epochs must be an integer >= 1"),
    (["probe", "depth=3"], "unknown option depth"),
    # probe said these as "max_len must be ...", naming no flag (features named --max-len)
    (["probe", "--sentences", "20", "--max-len", "2"], "--max-len 2: a word needs 3 tokens at least"),
    (["probe", "--sentences", "20", "--max-len", "500"], "--max-len 500: more tokens than the model"),
    (["features"], "give --data FILE"),
    (["features", "--task", "tagging", "--train", "x.conll"],
     "--task tagging needs --train FILE and --dev FILE"),
    (["features", "--data", "nowhere.txt"], "--data nowhere.txt: no such file"),
    (["features", "--data", "/dev/null"], "--data /dev/null: not a regular file"),  # said as missing
    (["features", "--data", "{bad}", "--layers", "all,1"], "--layers"),
    (["features", "--text", "The cat sat.", "--layers", "0,0,0"],
     "--layers '0,0,0' names layer 0 twice"),  # answered one layer, silently
    (["features", "--data", "{bad}", "--layers", "1,-1,2"], "names layer 2 twice (here -1 is layer 2)"),
    # the flag named once, not "--layers '5': layers '5': outside ..." (--data) or "--layers: layers ..."
    (["features", "--data", "{bad}", "--layers", "5"], "error: --layers '5': outside 0..2"),
    (["features", "--text", "a b", "--layers", "5"], "error: --layers '5': outside 0..2"),
    (["features", "--text", " "], "--text: the text to take features of is empty"),  # exit 0 before
    (["features", "--data", "{bad}", "--mix-gamma", "2"], "--mix-gamma: the scalar mix is for --text"),
    (["features", "--data", "{bad}", "--max-len", "100000"], "--max-len 100000: more tokens than the model"),
    (["features", "--data", "{bad}", "--max-len", "2"], "--max-len 2: a word needs 3 tokens at least"),
    (["features", "--data", "{bad}", "--truncate"], "--truncate: it cuts a --text"),  # was ignored
    (["features", "--data", "{empty}"], "s.txt: no sentences"),  # named no file
    (["features", "--data", "{nested}"], 's.jsonl:2: "words" must be a list of words'),  # was "['b']"
    # a null text was read as the word "None", a list as its repr's pieces; a blank word's features were 0
    (["features", "--data", "{null}"], 's.jsonl:2: no "words" list or "text" (a text) in the record'),
    (["features", "--data", "{listed}"], 's.jsonl:1: no "words" list or "text" (a text) in the record'),
    (["features", "--data", "{blank}"], 's.jsonl:1: "words"[1] is blank'),
])
def test_bad_input_is_one_line_with_status_2(model_dir, tmp_path, capsys, argv, named):
    files = {"{bad}": ("s.txt", "a b\n"), "{empty}": ("s.txt", "\n \n"),
             "{nested}": ("s.jsonl", '{"words": ["a"]}\n{"words": ["a", ["b"]]}\n'),
             "{null}": ("s.jsonl", '{"text": "a b"}\n{"text": null}\n'),
             "{listed}": ("s.jsonl", '{"text": ["a"]}\n'),
             "{blank}": ("s.jsonl", '{"words": ["a", " "]}\n')}
    argv = [write(tmp_path / files[a][0], files[a][1]) if a in files else a for a in argv]
    assert main([argv[0], "--model", model_dir, "--out", str(tmp_path / "o"), *argv[1:]]) == 2
    assert not (tmp_path / "o").exists()  # refused before any output
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and named in err and err.startswith(f"lmforge {argv[0]}: error:")


def test_a_blank_text_is_refused_before_the_model_is_read(model_dir, tmp_path, capsys, monkeypatch):
    """features --text ' ' is refused by the library's rule (text_features.feature_texts), which ran only
    once the model was loaded: the command's own check before the model had been dropped for it."""
    import lmforge.cli.analysis_probe as probe

    def unread(args):
        raise AssertionError("the model was read")

    monkeypatch.setattr(probe, "analysed_model", unread)
    assert main(["features", "--model", model_dir, "--text", "a", "--text", " ", "--out",
                 str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err == "lmforge features: error: --text: the text to take features of is empty (texts[1])\n", err
    assert not (tmp_path / "o").exists()
