"""A misspelt key=value option is refused on every job's command line as lmforge.config.names words it for
Python: one short line (exit 2) naming it, the closest options, and the `lmforge options KIND` that lists
them all, before any file is read (pretrain and finetune named the kinds of option, distill and retrieve
every encoder or loss option, prune nothing but the name)."""
from __future__ import annotations

import pytest

from lmforge.cli import main

NONE = "/nonexistent-lmforge-path"


@pytest.mark.parametrize("job, args, typo, meant", [
    ("pretrain", ["--preset", "bert-tiny", "--objective", "mlm"], "n_layer=2", "n_layers"),
    ("pretrain", ["--model", NONE, "--objective", "mlm"], "warmpu=2", "warmup"),
    ("finetune", ["--builtin", "sentiment", "--model", "bert-tiny"], "n_layer=2", "n_layers"),
    # a fine-tuning's max_length is its texts' length (max_len), not generation's new tokens it also has
    ("finetune", ["--builtin", "sentiment", "--model", "bert-tiny"], "max_length=64", "max_len"),
    ("distill", ["--teacher", NONE, "--train", NONE, "--data", NONE], "temprature=2", "temperature"),
    ("prune", ["--model", NONE, "--method", "magnitude", "--sparsity", "0.5", "--data", NONE,
               "--train", NONE], "strat=0.1", "start"),
    ("retrieve", ["train", "--model", NONE], "temprature=2", "temperature"),
])
def test_a_typo_is_one_short_line_with_the_closest_option_and_where_they_are_listed(
        job, args, typo, meant, tmp_path, capsys):
    assert main([job, *args, "--out", str(tmp_path / "o"), typo]) == 2
    err = capsys.readouterr().err.strip()
    name = typo.split("=")[0]
    assert f"unknown option {name}; did you mean {meant}" in err and f"lmforge options {job}" in err
    assert len(err) < 200 and "\n" not in err and not (tmp_path / "o").exists()


def test_a_name_close_to_no_option_is_named_with_where_they_are_listed(tmp_path, capsys):
    assert main(["pretrain", "--preset", "bert-tiny", "--objective", "mlm", "--out", str(tmp_path / "o"),
                 "colour=red"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("error: unknown option colour (all: lmforge options pretrain)")


@pytest.mark.parametrize("job, args", [
    ("pretrain", ["--preset", "bert-tiny", "--objective", "mlm"]),
    ("finetune", ["--builtin", "sentiment", "--model", "bert-tiny"]),
    ("distill", ["--teacher", NONE, "--train", NONE, "--data", NONE]),
    ("probe", ["--model", NONE, "--data", NONE]),
])
def test_a_typo_in_a_config_file_names_the_file_the_key_and_the_closest_option(job, args, tmp_path, capsys):
    """The refusal named the key alone, though a bad value from the same file named the file to mend."""
    config = tmp_path / "run.yaml"
    config.write_text("lr: 0.001\nepochz: 2\n")
    assert main([job, *args, "--out", str(tmp_path / "o"), "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown option epochz; did you mean epochs?" in err, err
    assert err.rstrip().endswith(f"(from --config {config})") and not (tmp_path / "o").exists()


def test_a_typo_given_as_key_value_is_not_said_to_come_from_the_config_file(tmp_path, capsys):
    config = tmp_path / "run.yaml"
    config.write_text("epochz: 2\n")
    assert main(["pretrain", "--preset", "bert-tiny", "--objective", "mlm", "--out", str(tmp_path / "o"),
                 "--config", str(config), "epochz=3"]) == 2  # key=value wins over the file: the line's one
    err = capsys.readouterr().err
    assert "unknown option epochz" in err and "--config" not in err
