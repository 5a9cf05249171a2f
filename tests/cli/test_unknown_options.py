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
