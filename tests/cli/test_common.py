"""cli/common: an output folder that would write over its source is refused; unreadable inputs are named."""
import pytest

from lmforge.cli.common import UsageError, refuse_overwrite
from lmforge.utils.atomic import UnsafePath


def test_an_output_that_is_or_holds_a_source_model_is_refused(tmp_path):
    source = tmp_path / "run" / "model"
    source.mkdir(parents=True)
    (tmp_path / "afile").write_text("x")
    for out, message in [("", "--out is empty"), ("  ", "--out is empty"),
                         (str(tmp_path / "afile"), "exists and is not a folder")]:
        with pytest.raises(UsageError, match=message):  # the out path itself: the command's own checks
            refuse_overwrite(out, ("--model", str(source)), kind="folder", sources=("--model",))
    for out, relation in [(source, "is"), (tmp_path / "run", "holds"), (tmp_path, "holds")]:
        with pytest.raises(UnsafePath, match=f"^--out {out} {relation} the input --model {source}: ") as err:
            refuse_overwrite(str(out), ("--model", str(source)), kind="folder", sources=("--model",))
        assert err.value.field == "--out"  # the output's name: the flag
    # a data input is no source model: an output folder may hold it where it writes no name over it
    refuse_overwrite(str(tmp_path / "run"), ("--data", str(source)), writes=("report.json",))


def test_refuse_overwrite_refuses_an_empty_output_which_would_be_the_working_folder(tmp_path):
    for out in ("", "  "):
        with pytest.raises(UsageError, match="^--out is empty"):
            refuse_overwrite(out, ("--data", str(tmp_path)))
    refuse_overwrite(None, ("--data", str(tmp_path)))  # no output asked for: nothing to refuse


def test_new_folders_beside_or_inside_a_source_model_are_accepted(tmp_path):
    source = tmp_path / "run" / "model"
    source.mkdir(parents=True)
    for out in (tmp_path / "other", tmp_path / "run" / "model" / "q", tmp_path / "run2"):
        refuse_overwrite(str(out), ("--model", [str(source), "all-MiniLM-L6-v2"]), ("--teacher", None),
                         writes=("model",), sources=("--model", "--teacher"))
    with pytest.raises(UsageError, match="--teacher-out"):
        refuse_overwrite("", option="--teacher-out", kind="folder")


def test_refuse_overwrite_refuses_a_file_of_an_input_folder_and_accepts_a_new_one(tmp_path):
    """`lmforge attention --model DIR --out DIR/config.json` wrote its HTML over the model's config."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    with pytest.raises(UnsafePath, match="lies inside the input --model"):
        refuse_overwrite(model / "config.json", ("--model", str(model)))
    with pytest.raises(UnsafePath, match="lies inside the input --model"):  # a name the job writes
        refuse_overwrite(model, ("--model", str(model / "..")), writes=("config.json",))
    refuse_overwrite(model / "view.html", ("--model", str(model)))  # a new file beside the inputs: fine


def test_refuse_overwrite_refuses_a_written_name_hard_linked_to_an_input(tmp_path):
    """out/metrics.jsonl as a hard link to --train: the run's appends would change the training data."""
    import os

    (tmp_path / "out").mkdir()
    (tmp_path / "train.jsonl").write_text("{}")
    os.link(tmp_path / "train.jsonl", tmp_path / "out" / "metrics.jsonl")
    train = str(tmp_path / "train.jsonl")
    with pytest.raises(UnsafePath, match="holds the input --train"):
        refuse_overwrite(tmp_path / "out", ("--train", train), writes=("metrics.jsonl",))
    refuse_overwrite(tmp_path / "out", ("--train", train), writes=("final",))


def test_refuse_overwrite_judges_a_rerun_as_its_first_run(tmp_path):
    """`evaluate --model runs/sst --out runs/sst/preds.jsonl` ran, then its rerun was refused: the first run's
    preds.jsonl had become an 'input'. A model folder's inputs are its model files, by kind; a data folder's,
    every file, written yet or not."""
    model, data = tmp_path / "model", tmp_path / "data"
    model.mkdir(), data.mkdir()
    (model / "config.json").write_text("{}")
    for attempt in range(2):
        for report in ("preds.jsonl", "embeddings.npy", "view.html"):  # a job's outputs beside the model
            refuse_overwrite(model / report, ("--model", str(model)), kind="file")
        (model / "preds.jsonl").write_text("a report")
        for name in ("config.json", "vocab.txt", "model.safetensors"):  # written yet or not: the model's
            with pytest.raises(UnsafePath, match="lies inside the input --model"):
                refuse_overwrite(model / name, ("--model", str(model)), kind="file")
        read_back = "lies inside the input --data .*: every file of that folder is read"  # not written over
        with pytest.raises(UnsafePath, match=read_back):
            refuse_overwrite(data / "out.txt", ("--data", str(data)), kind="file")
        (data / "out.txt").write_text("would be read as data")

def test_records_and_config_files_that_cannot_be_read_are_named(tmp_path):
    from lmforge.cli.common import read_records, resolve_config
    from lmforge.io import CheckpointError

    with pytest.raises(UsageError, match=r"^--importance-data .*nofile.jsonl: No such file or directory$"):
        read_records("--importance-data", str(tmp_path / "nofile.jsonl"), "cls", None)
    for text, message in [("[1, 2]", "must hold a JSON object"), ("{not json", "is not valid JSON")]:
        (tmp_path / "c.json").write_text(text)
        with pytest.raises(CheckpointError, match=f"c.json {message}"):
            resolve_config(str(tmp_path / "c.json"), {})


def test_evaluate_names_the_option_it_refuses(tmp_path, capsys):
    from lmforge.cli import main

    for argv, message in [(["evaluate", "--model", str(tmp_path), "--task", "cls", "--data",
                            str(tmp_path / "missing.jsonl")], "missing.jsonl: No such file or directory"),
                          ]:
        (tmp_path / "config.json").write_text("{}")
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err


@pytest.mark.parametrize("argv, flag", [
    (["generate", "--model", "m", "--seed", "9" * 23, "hi"], "--seed"),  # was "Overflow when unpacking ..."
    (["heads", "--model", "m", "--data", "d", "--out", "o", "--random-orders", "10" * 4], "--random-orders"),
    (["heads", "--model", "m", "--data", "d", "--out", "o", "--batch-size", "0"], "--batch-size"),
    (["probe", "--model", "m", "--out", "o", "--sentences", "1000000000000"], "--sentences"),  # were hangs
    (["quantize", "--model", "m", "--out", "o", "--batch-size", "100000000"], "--batch-size"),  # 51 GB
    (["evaluate", "--model", "m", "--data", "d.jsonl", "--batch-size", "0"], "--batch-size"),
    *[([*command, "--steps", steps], "--steps") for steps in ("0", "10000001")
      for command in (["pretrain", "--preset", "bert-tiny", "--out", "o"],
                      ["finetune", "--model", "m", "--out", "o"],
                      ["distill", "--teacher", "t", "--train", "d", "--out", "o"],
                      ["retrieve", "train", "--out", "o"], ["retrieve", "realm", "--out", "o"])],
    (["evaluate", "--model", "m", "--data", "d.jsonl", "--batch-size", "1000000000000"], "--batch-size"),
    (["retrieve", "train", "--out", "o", "--hard-negatives", "-1"], "--hard-negatives"),
    (["finetune", "--model", "m", "--builtin", "sentiment", "--out", "o", "--builtin-size", "nan"],
     "--builtin-size")])
def test_count_flags_are_bounded_both_ways_before_any_work(capsys, argv, flag):
    from lmforge.cli import main

    with pytest.raises(SystemExit) as refused:
        main(argv)
    err = capsys.readouterr().err
    value = argv[argv.index(flag) + 1]
    assert refused.value.code == 2 and err.count("\n") == 1 and f"error: {flag} {value}: " in err, err


def test_an_output_that_cannot_be_written_is_refused_before_any_work(tmp_path):
    from lmforge.cli.common import UsageError, refuse_overwrite

    (tmp_path / "afile").write_text("kept")
    (tmp_path / "adir").mkdir()
    cases = [(tmp_path / "afile", dict(writes=("metrics.jsonl",)), "exists and is not a folder"),
             (tmp_path / "adir", dict(kind="file"), "is a folder; name the file to write"),
             (tmp_path / "afile" / "out.jsonl", dict(kind="file"), "afile is a file, not a folder"),
             (tmp_path / "gone" / "out", dict(writes=("metrics.jsonl",)),
              "gone is a symbolic link to nothing, not a folder")]
    (tmp_path / "gone").symlink_to(tmp_path / "nowhere")
    for out, how, message in cases:
        with pytest.raises(UsageError, match=message):
            refuse_overwrite(str(out), ("--data", None), **how)
    refuse_overwrite(str(tmp_path / "adir"), ("--data", None))  # a folder where either may go: fine
    assert (tmp_path / "afile").read_text() == "kept"


def test_the_steps_flags_bound_is_train_configs():
    from lmforge.cli.common import STEPS
    from lmforge.train.config import MAX_STEPS

    assert STEPS == (1, MAX_STEPS)


@pytest.mark.parametrize("argv", [
    ["finetune", "--model", "bert-tiny", "--builtin", "sentiment", "--steps", "1", "--out", "{out}"],
    ["embed", "--model", "all-MiniLM-L6-v2", "a b", "--out", "{out}"],
    ["convert", "bert-tiny", "{out}", "--to", "hf"],
])
@pytest.mark.parametrize("target", ["folder", "nowhere"])
def test_no_output_is_written_through_a_symbolic_link(tmp_path, capsys, argv, target):
    from lmforge.cli import main

    (tmp_path / "folder").mkdir()
    link = tmp_path / "out"
    link.symlink_to(tmp_path / target)
    assert main([a.format(out=link) for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is a symbolic link; outputs are never written through one" in err
    assert link.is_symlink() and not any((tmp_path / "folder").iterdir())  # both as they were


def test_a_file_output_replaces_its_link_and_never_writes_where_it_points(tmp_path):
    from lmforge.utils.atomic import atomic_write_text

    (tmp_path / "kept.txt").write_text("kept")
    link = tmp_path / "out.txt"
    link.symlink_to(tmp_path / "kept.txt")
    refuse_overwrite(link, kind="file")  # a file output may be a link: it is replaced, not followed
    atomic_write_text(link, "new")
    assert not link.is_symlink() and link.read_text() == "new"
    assert (tmp_path / "kept.txt").read_text() == "kept"


def test_every_bounded_flag_says_its_bounds_and_every_error_its_whole_command(capsys):
    import argparse

    from lmforge.cli import build_parser, main

    def walk(parser):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    yield from walk(sub)
            elif getattr(action.type, "bounds", None):
                yield parser.prog, action

    flags = list(walk(build_parser()))
    assert len(flags) > 40  # every command's counts, sizes and seeds
    for prog, action in flags:
        low, high = action.type.bounds
        assert f"[{low}, {high}]" in action.help, (prog, action.option_strings)
    assert main(["index", "build", "--passages", "none.txt", "--out", "x"]) == 2
    assert capsys.readouterr().err.startswith("lmforge index build: error: --passages none.txt")


def test_a_flag_read_into_an_options_object_says_the_objects_bounds():
    import argparse
    import dataclasses

    from lmforge.analysis.head_report import HeadsOptions
    from lmforge.cli import build_parser
    from lmforge.compress.quantize_options import QuantizeOptions
    from lmforge.config.options import bounds_text

    commands = {a.dest: a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)}
    subs = next(iter(commands.values())).choices
    for command, cls, names in (("heads", HeadsOptions, ("prune", "until", "step")),
                                ("quantize", QuantizeOptions, ("seed",))):
        helps = {a.dest: a.help for a in subs[command]._actions}
        meta = {f.name: f.metadata for f in dataclasses.fields(cls)}
        for name in names:  # the flags said no bounds, though the object enforces them
            assert bounds_text(meta[name]).strip() in helps[name], (command, name, helps[name])


def test_a_field_whose_none_stands_for_a_default_says_that_default_in_its_help():
    import argparse
    from dataclasses import dataclass

    from lmforge.cli.common import option_flags
    from lmforge.config.options import help_rows, option

    @dataclass
    class Picked:
        candidates: int | None = option(None, "passages re-ordered", low=1, high=10, unset="k")

    parser = argparse.ArgumentParser()
    option_flags(parser, Picked)
    (flag,) = [a for a in parser._actions if a.dest == "candidates"]
    assert flag.help == "passages re-ordered (default k; [1, 10])" and flag.default is None  # None: not given
    assert help_rows(Picked) == [("candidates", "k", "passages re-ordered [1, 10]")]


@pytest.mark.parametrize("value, accepted", [("3.0", True), ("1e1", True), ("3.5", False), ("0.0", False),
                                             ("inf", False), ("65537.0", False)])
def test_a_bounded_count_flag_reads_a_whole_number_as_python_does(tmp_path, capsys, value, accepted):
    # bounded(int, ...) read "3.0" with int() and refused it where lmforge.embed(batch_size=3.0) took 3
    import lmforge
    from lmforge.cli import main
    from tests.serve.conftest import _save, _tiny, _tokenizer

    tokenizer = _tokenizer("bert")
    path = _save(_tiny("bert-base", tokenizer, max_seq_len=32), tokenizer, tmp_path / "m")
    try:
        python = lmforge.embed(["a cat"], str(path), batch_size=float(value)).shape[0] == 1
    except lmforge.OptionsError as err:
        python = err.field
    try:
        status = main(["embed", "--model", str(path), "a cat", "--batch-size", value])
    except SystemExit as exit_:
        status = exit_.code
    err = capsys.readouterr().err
    assert (python is True, status == 0) == (accepted, accepted), (python, status, err)
    assert accepted or (python == "batch_size" and status == 2 and f"--batch-size {value}: " in err), err


def test_every_integer_flag_reads_a_whole_number_as_python_does():
    """An int flag reads "3.0" and "1e3" as the options objects read 3.0 (HeadsOptions(batch_size=8.0) is 8),
    and refuses a fraction: no flag of any sub-command is read by plain int()."""
    import argparse

    from lmforge.cli import build_parser
    from lmforge.cli.common import integer

    assert integer("3.0") == 3 and integer("1e3") == 1000 and integer(str(10 ** 20)) == 10 ** 20
    with pytest.raises(ValueError):
        integer("2.5")
    def plain(parser) -> list:  # the flags read by int(), in `parser` and its sub-commands at any depth
        found = [f"{parser.prog} {a.option_strings[0]}" for a in parser._actions if a.type is int]
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                found += [flag for sub in action.choices.values() for flag in plain(sub)]
        return found

    assert plain(build_parser()) == []
    args = build_parser().parse_args(["heads", "--model", "m", "--data", "d", "--out", "o",
                                      "--batch-size", "8.0"])
    assert args.batch_size == 8 and isinstance(args.batch_size, int)


def test_a_config_file_is_read_bounded_and_its_faults_are_one_line_naming_it(tmp_path):
    from lmforge.cli.common import MAX_CONFIG_BYTES, read_config_file

    cases = {"big.yaml": ("#" * (MAX_CONFIG_BYTES + 1), "larger than"),
             "dup.json": ('{"steps": 1,\n "steps": 2}', "key 'steps' given twice"),
             "list.yaml": ("- 1\n- 2\n", "must hold a mapping"), "empty.yaml": ("", "must hold a mapping"),
             "tag.yaml": ("x: !!python/object:os.system {}\n", "could not determine a constructor")}
    for name, (text, message) in cases.items():
        (tmp_path / name).write_text(text)
        with pytest.raises(UsageError, match=message) as err:
            read_config_file(str(tmp_path / name))
        assert name in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(UsageError, match="larger than"):
        read_config_file("/dev/zero")  # read no further than the bound: never all of an endless file
    with pytest.raises(UsageError, match="Is a directory"):
        read_config_file(str(tmp_path))


def test_inspect_takes_its_overrides_wherever_they_stand_among_its_flags(tmp_path, capsys):
    from lmforge.cli import main

    (tmp_path / "c.yaml").write_text("d_model: 64\nn_heads: 4\n")
    config = str(tmp_path / "c.yaml")
    for args in (["bert-tiny", "--config", config, "d_model=96"],
                 ["--config", config, "bert-tiny", "d_model=96"],
                 ["bert-tiny", "d_model=96", "--config", config]):
        assert main(["inspect", *args]) == 0, capsys.readouterr().err
        assert "d_model=96, d_ff=512, 4 heads x 24" in capsys.readouterr().out  # key=value over the file's


class _Captured(Exception):
    """Raised by a stand-in for a training run, carrying the TrainConfig it was given."""


def _train_commands(model: str, data: str) -> dict:
    """command -> argv of finetune, prune (magnitude) and distill on `model` and `data`, less --out."""
    return {"finetune": ["finetune", "--model", model, "--task", "cls", "--train", data],
            "prune": ["prune", "--model", model, "--task", "cls", "--method", "magnitude",
                      "--sparsity", "0.5", "--data", data, "--train", data],
            "distill": ["distill", "--teacher", model, "--train", data, "--data", data]}


def test_finetune_prune_and_distill_build_one_train_config_from_the_same_flags_and_options(tmp_path,
                                                                                          monkeypatch):
    import json

    import lmforge.compress.sparse_finetune as sparse
    import lmforge.compress.task_distillation as distillation
    import lmforge.tasks.finetune as finetune
    from lmforge.cli import main
    from lmforge.train import TrainConfig
    from tests.tasks.core import saved_classifier, sentiment

    def run(*args, **kwargs):
        raise _Captured(next(a for a in (*args, *kwargs.values()) if isinstance(a, TrainConfig)))

    for module, name in ((finetune, "finetune"), (sparse, "run_sparse_prune"), (distillation, "run_distill")):
        monkeypatch.setattr(module, name, run)
    records = sentiment(40)["train"][:16]
    model = saved_classifier(tmp_path / "m", "bert-base", "bert", records, 32)
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    (tmp_path / "c.yaml").write_text("lr: 0.002\nwarmup: 7\nseed: 9\n")
    given = ["--config", str(tmp_path / "c.yaml"), "--steps", "12", "warmup=3", "batch_size=4"]
    built = {}
    for command, argv in _train_commands(str(model), str(data)).items():
        with pytest.raises(_Captured) as got:
            main([*argv, *given, "--out", str(tmp_path / command)])
        built[command] = got.value.args[0]
    assert built["finetune"] == built["prune"] == built["distill"]  # one merge: one config
    # a flag over key=value over the file; the file's own where nothing else says it
    assert [getattr(built["prune"], k) for k in ("steps", "warmup", "batch_size", "lr", "seed")] == [12, 3, 4,
                                                                                                     0.002, 9]


@pytest.mark.parametrize("bad, field", [("lr=0", "lr"), ("warmup=-1", "warmup"), ("steps=0", "steps"),
                                        ("seed=-1", "seed"), ("batch_size=1e9", "batch_size")])
def test_finetune_prune_and_distill_refuse_an_out_of_bounds_training_option_alike(tmp_path, monkeypatch,
                                                                                  capsys, bad, field):
    from lmforge.cli import main

    monkeypatch.chdir(tmp_path)
    errors = set()
    for command, argv in _train_commands("/missing", "/missing.jsonl").items():
        assert main([*argv, "--out", "o", bad]) == 2, command
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"{field} must be" in err and "/missing" not in err, (command, err)
        errors.add(err.partition(": ")[2])  # past the command's own name
    assert len(errors) == 1, errors  # the same words from all three
    assert list(tmp_path.iterdir()) == []  # refused before any output folder is made


def test_a_source_models_written_names_are_judged_by_utils_atomic_writes_over(tmp_path):
    """out/model a link to the source model: replacing out/model would replace the model read."""
    source = tmp_path / "source"
    source.mkdir()
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "model").symlink_to(source, target_is_directory=True)
    with pytest.raises(UnsafePath, match="holds the input --model"):
        refuse_overwrite(str(tmp_path / "out"), ("--model", str(source)), writes=("model", "report.json"),
                         sources=("--model",))
    refuse_overwrite(str(tmp_path / "out"), ("--model", str(source)), writes=("report.json",),
                     sources=("--model",))
