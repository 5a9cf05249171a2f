"""Every key=value option has a line of help and is listed, with its default, by `lmforge options`
and in the --help epilog of pretrain and finetune."""
import argparse
import dataclasses

import pytest

from lmforge.cli import main
from lmforge.cli import pretrain
from lmforge.cli.options import RECIPE, SECTIONS, add_parsers, options_epilog, options_text, rows, show
from lmforge.config.options import bounds_text
from lmforge.config import ModelConfig
from lmforge.tasks.finetune import TaskConfig
from lmforge.train import TrainConfig

KINDS = {"pretrain": (TrainConfig, RECIPE[1], ModelConfig),
         "finetune": (TrainConfig, TaskConfig, ModelConfig),
         "model": (ModelConfig,)}


@pytest.mark.parametrize("cls", [TrainConfig, TaskConfig, ModelConfig], ids=lambda c: c.__name__)
def test_every_field_has_one_line_of_help(cls):
    for field in dataclasses.fields(cls):
        text = field.metadata.get("help", "")
        assert text.strip() and "\n" not in text, f"{cls.__name__}.{field.name} has no one-line help"


@pytest.mark.parametrize("kind", list(KINDS))
def test_the_listing_holds_every_field_with_its_default_and_help(kind, capsys):
    parser = argparse.ArgumentParser()
    add_parsers(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["options", kind])
    args.func(args)
    printed = capsys.readouterr().out
    assert [cls for _, cls in SECTIONS[kind]] == list(KINDS[kind])
    lines = printed.splitlines()
    for options in KINDS[kind]:
        for name, default, text in rows(options):
            line = next((x for x in lines if x.split()[:1] == [f"{name}={show(default)}"]), None)
            assert line is not None and text and line.endswith(text), name
    assert printed.strip() in options_epilog(kind)


def test_the_pretraining_recipe_options_are_listed():
    listed = {name for name, _, _ in rows(RECIPE[1])}
    assert set(getattr(pretrain, "RECIPE_KEYS", ())) <= listed  # cli/pretrain.py's own key=value options


def test_defaults_are_written_as_on_the_command_line():
    assert [show(v) for v in (None, True, (0.9, 0.999), "linear", "", 1e-4, 3)] == \
        ["null", "true", "[0.9,0.999]", "linear", '""', "0.0001", "3"]


def test_lmforge_options_through_the_command(capsys):
    assert main(["options", "finetune"]) == 0
    out = capsys.readouterr().out
    assert "epochs=null" in out and "patience=0" in out and "d_model=768" in out
    assert main(["options"]) == 0  # every section
    out = capsys.readouterr().out
    assert all(title.split(" (")[0] in out for title, _ in SECTIONS["finetune"])
    with pytest.raises(SystemExit) as stop:
        main(["options", "nonsense"])
    assert stop.value.code == 2
    assert options_text() != options_text("model")


def test_every_bounded_option_is_listed_with_its_bounds():
    text = options_text("pretrain")
    lines = {line.split()[0].split("=")[0]: line for line in text.splitlines() if line.startswith("  ")}
    assert lines["steps"].endswith("[1, 10000000]") and lines["lr"].endswith("(0, 10]")
    assert lines["keep_last"].endswith("[1, 1000]") and lines["max_len"].endswith("[2, 1048576]")
    assert lines["betas"].endswith("(2, each in [0, 1))")  # a list option: its count and each item's bounds
    for f in dataclasses.fields(TrainConfig):
        if f.metadata.get("high") is not None:
            listed = bounds_text(f.metadata)
            assert str(f.metadata["high"]) in listed and lines[f.name].endswith(listed), f.name


@pytest.mark.parametrize("kind, keys", [
    ("probe", ("epochs", "lr", "hidden", "rank")), ("distill", ("temperature", "alpha", "gamma")),
    ("prune", ("start", "end", "scores_lr_scale", "soft_lambda")),
    ("retrieve", ("temperature", "max_length", "matryoshka_dims"))])
def test_the_other_jobs_key_values_are_listed_with_their_bounds(kind, keys, capsys):
    from lmforge.analysis.probe_fit import FitConfig
    from lmforge.compress.sparse_finetune import SparseConfig
    from lmforge.compress.task_distillation import DistillConfig
    from lmforge.retrieval.dpr import EncoderOptions

    classes = {"probe": FitConfig, "distill": DistillConfig, "prune": SparseConfig,
               "retrieve": EncoderOptions}
    cls = classes[kind]
    assert main(["options", kind]) == 0
    lines = {line.split()[0].split("=")[0]: line for line in capsys.readouterr().out.splitlines()
             if line.startswith("  ")}
    meta = {f.name: f.metadata for f in dataclasses.fields(cls)}
    for key in keys:
        assert lines[key].endswith(bounds_text(meta[key])), (kind, key)
    assert not {"student", "student_layers", "method", "sparsity"} & set(lines)  # flags, not key=value
    assert (kind == "probe") == ("steps" not in lines)  # the training options of the jobs that take them


@pytest.mark.parametrize("command", ["distill", "prune", "retrieve"])
def test_a_commands_help_lists_its_key_value_options_as_lmforge_options_does(command, capsys):
    with pytest.raises(SystemExit) as stop:
        main([command, "--help"])
    assert stop.value.code == 0
    helped = capsys.readouterr().out
    assert options_text(command) in helped and "key=value options, with their defaults:" in helped
