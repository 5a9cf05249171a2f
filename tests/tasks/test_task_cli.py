"""`lmforge finetune` and `lmforge evaluate`: outputs and exit codes."""
import json

import pytest

from lmforge.cli import main
from tests.tasks.core import tiny, tokenizer

FAST = ["batch_size=8", "lr=3e-3", "warmup=0", "progress=false", "--builtin-size", "60"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("model")
    tiny(n_layers=1).save(path)
    tokenizer().save(path)
    return path


def write(path, text):
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_finetune_then_evaluate_files(model_dir, tmp_path, capsys):
    train = write(tmp_path / "train.csv", "sentence,gold\nIt is superb.,pos\nIt broke.,neg\nI love it.,pos\n")
    valid = write(tmp_path / "valid.tsv", "sentence\tgold\nIt is great.\tpos\nIt is flimsy.\tneg\n")
    out = tmp_path / "run"
    assert main(["finetune", "--model", str(model_dir), "--task", "cls", "--train", train, "--valid", valid,
                 "--columns", "text=sentence,label=gold", "--out", str(out), "--steps", "2", *FAST[:4]]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 2 and set(summary["best"]) == {"accuracy", "f1", "matthews"}
    assert (out / "best" / "task.json").is_file() and (out / "final" / "model.safetensors").is_file()
    test = write(tmp_path / "test.csv", "sentence,gold\nIt is superb.,pos\n")
    preds = tmp_path / "pred.jsonl"
    assert main(["evaluate", "--model", str(out / "best"), "--data", test, "--columns",
                 "text=sentence,label=gold", "--out", str(preds)]) == 0
    row = json.loads(preds.read_text())
    assert row["line"] == 2 and row["gold"] == "pos" and row["prediction"] in ("pos", "neg")


def test_finetune_builtin_and_evaluate_split(model_dir, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["finetune", "--model", str(model_dir), "--builtin", "sentiment", "--out", str(out),
                 "--steps", "2", "patience=1", "freeze_embeddings=true", *FAST]) == 0
    assert main(["evaluate", "--model", str(out / "final"), "--builtin", "sentiment", "--split", "test",
                 "--builtin-size", "60"]) == 0
    printed = capsys.readouterr().out
    result = json.loads(printed[printed.rindex('{\n  "task"'):])
    assert result["task"] == "cls" and result["records"] == 6 and "accuracy" in result


def test_qa_options_reach_the_task_and_its_task_json(model_dir, tmp_path):
    out = tmp_path / "run"
    assert main(["finetune", "--model", str(model_dir), "--builtin", "questions", "--out", str(out),
                 "--steps", "2", "max_answer_len=1", "n_best=3", "doc_stride=20", *FAST]) == 0
    info = json.loads((out / "final" / "task.json").read_text())
    assert (info["kind"], info["max_answer_len"], info["n_best"], info["doc_stride"]) == ("qa", 1, 3, 20)
    preds = tmp_path / "pred.jsonl"
    assert main(["evaluate", "--model", str(out / "final"), "--builtin", "questions", "--builtin-size", "60",
                 "--out", str(preds)]) == 0
    answers = [json.loads(line)["prediction"] for line in preds.read_text().splitlines()]
    assert answers and all(len(a.split()) <= 1 for a in answers)  # one token at most, as trained


@pytest.mark.parametrize("args, message", [
    (["--task", "cls", "--out", "o"], "give --train FILE"),
    (["--builtin", "sentiment", "--task", "pair", "--out", "o"], "is a cls task, not pair"),
    (["--builtin", "sentiment", "--out", "o", "n_layers=1"], "model config fields apply to presets only"),
    # no option at all: said so, not "apply to presets only" (a folder) or the model fields alone (a preset)
    (["--builtin", "sentiment", "--out", "o", "frozen=1"], "unknown option frozen"),
    (["--builtin", "sentiment", "--out", "o", "learning_rate=1e-5"], "(all: lmforge options finetune)"),
    (["--builtin", "sentiment", "--out", "o", "layer_decay=2"],
     "layer_decay must be a finite number > 0 and <= 1"),
    (["--builtin", "questions", "--out", "o", "n_best=0"], "n_best must be an integer >= 1 and <= 1000"),
    (["--builtin", "questions", "--out", "o", "max_answer_len=2.5"], "max_answer_len must be a whole number"),
])
def test_finetune_usage_errors_exit_2(model_dir, capsys, args, message):
    assert main(["finetune", "--model", str(model_dir), *args]) == 2
    assert message in capsys.readouterr().err


def test_bad_files_exit_2_naming_file_and_line(model_dir, tmp_path, capsys):
    train = write(tmp_path / "train.csv", "text,label\na,pos\nb,neg\n")
    valid = write(tmp_path / "valid.csv", "text,label\na,pos\nb,neutral\n")
    assert main(["finetune", "--model", str(model_dir), "--task", "cls", "--train", train, "--valid", valid,
                 "--out", str(tmp_path / "o")]) == 2
    assert "valid.csv:3: label 'neutral' does not occur in the training data" in capsys.readouterr().err
    bad = tmp_path / "bad.csv"
    bad.write_bytes(b"text,label\n\xff,pos\n")
    assert main(["finetune", "--model", str(model_dir), "--task", "cls", "--train", str(bad),
                 "--out", str(tmp_path / "o")]) == 2
    assert "bad.csv:2: not valid UTF-8" in capsys.readouterr().err


@pytest.mark.parametrize("record, said", [
    ('{"text": "b"}', "no column 'label' (for label); the record has 'text'"),
    ('{"text": ["b"], "label": "neg"}', "text (column 'text') must be text (a string or number), got"),
])
def test_a_bad_jsonl_record_is_one_line_naming_file_and_line_exit_2(model_dir, tmp_path, capsys, record,
                                                                     said):
    """The record checks raise OptionsError (a ValueError): the command still says one line, file and line."""
    train = write(tmp_path / "train.jsonl", '{"text": "a", "label": "pos"}\n' + record + "\n")
    assert main(["finetune", "--model", str(model_dir), "--task", "cls", "--train", train,
                 "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"lmforge finetune: error: {train}:2: {said}") and err.count("\n") == 1


def test_preset_needs_a_tokenizer(capsys, tmp_path):
    assert main(["finetune", "--model", "bert-base", "--builtin", "sentiment", "--out", str(tmp_path)]) == 2
    assert "needs a tokenizer" in capsys.readouterr().err


def test_preset_with_tokenizer_and_model_fields(model_dir, tmp_path):
    out = tmp_path / "run"
    assert main(["finetune", "--model", "bert-base", "--tokenizer", str(model_dir), "--builtin", "sentiment",
                 "--out", str(out), "--steps", "1", "n_layers=1", "d_model=32", "n_heads=4", "d_ff=64",
                 *FAST]) == 0
    assert json.loads((out / "best" / "config.json").read_text())["config"]["d_model"] == 32


@pytest.mark.parametrize("name, text", [("task.json", '{"kind": '), ("config.json", "{not json")])
def test_a_corrupt_task_or_config_json_is_one_line_naming_the_file(model_dir, tmp_path, capsys, name, text):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(model_dir, broken)
    (broken / name).write_text(text)
    data = write(tmp_path / "test.jsonl", '{"text": "good", "label": "1"}\n')
    assert main(["evaluate", "--model", str(broken), "--task", "cls", "--data", data]) == 2
    err = capsys.readouterr().err
    assert f"{broken / name} is not valid JSON: Expecting" in err and err.count("\n") == 1


@pytest.mark.parametrize("command", ["evaluate", "finetune"])
def test_a_model_that_is_no_directory_is_named_before_the_data(tmp_path, capsys, monkeypatch, command):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "q1").mkdir()  # a folder without config.json
    (tmp_path / "afile").write_text("x")
    data = ["--data", "test.jsonl"] if command == "evaluate" else ["--train", "t.jsonl", "--out", "o"]
    for name, message in (("nodir/x", "--model nodir/x: no such directory"),
                          ("q1", "--model q1: is not a model directory: config.json is missing"),
                          ("afile", "--model afile: is a file, not a model directory"),
                          ("bogus", "--model bogus: no such directory (nor a preset name"),
                          ("elmo-small", "--model elmo-small is an ELMo preset: pretrain it first")):
        assert main([command, "--model", name, *data]) == 2  # no --task: the model was to tell it
        err = capsys.readouterr().err
        assert message in err and "--task" not in err and err.count("\n") == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "q1"]


def test_fine_tuning_writes_best_and_final_whole_with_their_task_files(model_dir, tmp_path):
    """best/ and final/ are staged with the model's tokenizer and task.json and put in place whole (a link
    named best/ is replaced, its target untouched): a killed run leaves no folder a later job would load
    without its task."""
    from lmforge.tasks.finetune import TASK_FILE

    out = tmp_path / "ft"
    out.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (out / "best").symlink_to(elsewhere, target_is_directory=True)
    assert main(["finetune", "--model", str(model_dir), "--builtin", "sentiment", "--out", str(out),
                 "--steps", "2", "eval_every=1", *FAST]) == 0
    for name in ("best", "final"):
        files = {p.name for p in (out / name).iterdir()}
        assert not (out / name).is_symlink() and {"model.safetensors", "tokenizer.json", TASK_FILE} <= files
    assert not list(elsewhere.iterdir())


def test_a_job_s_output_folder_names_the_model_in_it_for_evaluate_and_finetune(model_dir, tmp_path, capsys):
    """Every loader reads a job's --out folder as the model it wrote (final/, model/): evaluate and finetune
    refused it ("config.json is missing") where embed and quantize took it."""
    out = tmp_path / "run"
    assert main(["finetune", "--model", str(model_dir), "--builtin", "sentiment", "--out", str(out),
                 "--steps", "1", *FAST]) == 0
    capsys.readouterr()
    assert main(["evaluate", "--model", str(out), "--builtin", "sentiment", "--builtin-size", "60"]) == 0
    by_folder = capsys.readouterr().out
    assert main(["evaluate", "--model", str(out / "final"), "--builtin", "sentiment",
                 "--builtin-size", "60"]) == 0
    assert capsys.readouterr().out == by_folder  # the same model, the same scores
    assert main(["finetune", "--model", str(out), "--builtin", "sentiment", "--out", str(tmp_path / "again"),
                 "--steps", "1", *FAST]) == 0


BRINGS = "--builtin sentiment brings its own records"
FOR_BUILTIN = "it is for a --builtin task"
SIZE = ["--builtin-size", "60"]


@pytest.mark.parametrize("command, args, message", [
    ("finetune", ["--builtin", "sentiment", "--train", "{file}"], f"--train: {BRINGS}"),
    ("finetune", ["--builtin", "sentiment", "--valid", "{file}"], f"--valid: {BRINGS}"),
    ("finetune", ["--builtin", "sentiment", "--columns", "text=a"], f"--columns: {BRINGS}"),
    ("finetune", ["--task", "cls", "--train", "{file}", *SIZE], f"--builtin-size: {FOR_BUILTIN}"),
    ("evaluate", ["--builtin", "sentiment", "--data", "{file}"], f"--data: {BRINGS}"),
    ("evaluate", ["--task", "cls", "--data", "{file}", "--split", "test"], f"--split: {FOR_BUILTIN}"),
    ("evaluate", ["--task", "cls", "--data", "{file}", *SIZE], f"--builtin-size: {FOR_BUILTIN}"),
])
def test_a_flag_the_records_source_does_not_read_is_refused(model_dir, tmp_path, capsys, command, args,
                                                             message):
    data = write(tmp_path / "d.csv", "text,label\nIt is superb.,pos\nIt broke.,neg\n")
    out = ["--out", str(tmp_path / ("o" if command == "finetune" else "p.jsonl"))]
    args = [data if a == "{file}" else a for a in args]
    assert main([command, "--model", str(model_dir), *args, *out]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and message in captured.err and len(captured.err.splitlines()) == 1
    assert not (tmp_path / "o").exists() and not (tmp_path / "p.jsonl").exists()


def test_finetune_flags_win_over_key_value_and_the_config_file_whose_seed_splits_the_task(model_dir, tmp_path,
                                                                                         monkeypatch):
    import lmforge.tasks.finetune as finetune
    import lmforge.tasks.formats as formats

    runs, drawn = [], []
    monkeypatch.setattr(finetune, "finetune", lambda net, tok, kind, train, valid, out, cfg, task, **_:
                        runs.append(cfg) or {})
    split = formats.builtin
    monkeypatch.setattr(formats, "builtin",
                        lambda name, size, seed: drawn.append(seed) or split(name, size, seed))
    config = write(tmp_path / "c.yaml", "steps: 2\nseed: 7\nwarmup: 5\n")
    base = ["finetune", "--model", str(model_dir), "--builtin", "sentiment", "--builtin-size", "60",
            "--config", config, "--out"]
    assert main([*base, str(tmp_path / "a"), "--steps", "1", "--seed", "3", "warmup=1"]) in (0, None)
    assert main([*base, str(tmp_path / "b")]) in (0, None)
    assert [(c.steps, c.seed, c.warmup) for c in runs] == [(1, 3, 1), (2, 7, 5)]
    assert drawn == [3, 7]  # the built-in task is split by the run's seed, wherever it was given


def test_finetune_standard_output_is_the_summary_alone_and_its_notes_on_standard_error(model_dir, tmp_path,
                                                                                         capsys):
    """`lmforge finetune ... > summary.json` keeps a JSON file: the run's notes (records cut, a warm-up
    longer than the run, a resume) go to standard error (docs/finetune.md: the summary on standard output)."""
    train = write(tmp_path / "train.csv", "sentence,gold\nIt is superb and lasts for years and years.,pos\n"
                                          "It broke.,neg\nI love it.,pos\n")
    argv = ["finetune", "--model", str(model_dir), "--task", "cls", "--train", train, "--columns",
            "text=sentence,label=gold", "--out", str(tmp_path / "run"), "batch_size=2", "progress=false",
            "max_len=6", "save_every=1"]
    for steps, resume in ((1, []), (2, ["--resume"])):
        assert main([*argv, "--steps", str(steps), *resume]) == 0
        said = capsys.readouterr()
        assert json.loads(said.out)["steps"] == steps  # the whole of it: one JSON object
        assert "were cut" in said.err and "warmup=" in said.err
    assert "resumed from" in said.err


def test_a_max_len_past_the_models_positions_exits_2_and_writes_nothing(model_dir, tmp_path, capsys):
    """finetune max_len=500 on a model of 128 positions ran at 128 tokens, exit 0 (task.json said 128)."""
    out = tmp_path / "run"
    assert main(["finetune", "--model", str(model_dir), "--builtin", "sentiment", "--out", str(out),
                 "--steps", "2", "max_len=500", *FAST]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "max_len=500: more tokens than the model reads (max_seq_len=128)" in err
    assert not out.exists()


def test_an_out_holding_a_run_s_checkpoints_exits_2_naming_out_before_the_model_is_read(model_dir, tmp_path,
                                                                                       capsys, monkeypatch):
    """It exited 2 (a FileExistsError, an OSError) only once the model was loaded and the records encoded."""
    from lmforge.tasks import finetune as module

    out = tmp_path / "run"
    (out / "checkpoints" / "step-0000002").mkdir(parents=True)
    monkeypatch.setattr(module, "load_model", lambda *a, **k: pytest.fail("the model was read first"))
    assert main(["finetune", "--model", str(model_dir), "--builtin", "sentiment", "--out", str(out),
                 "--steps", "2", *FAST]) == 2
    err = capsys.readouterr().err
    assert err == (f"lmforge finetune: error: --out {out} already holds a run's checkpoints: pass "
                   "resume=True (--resume) to continue it, or another folder\n")
