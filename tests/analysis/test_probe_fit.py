"""FitConfig, the training options of probes and feature-based heads: each bound refused both ways, in
Python and on the command line alike, naming the field; `lmforge probe --help` lists the bounds."""
from __future__ import annotations

import math

import pytest

from lmforge.analysis.probe_fit import MAX_WIDTH, FitConfig
from lmforge.config.options import OptionsError

# (field, a value below its bounds, one above, one inside)
BOUNDS = [("epochs", 0, 10_001, 10_000), ("lr", 0, 10.5, 10), ("mix_lr", -0.1, 10.5, 0),
          ("batch_size", 0, 65_537, 65_536), ("sentence_batch", 0, 65_537, 1), ("patience", 0, 10_001, 1),
          ("hidden", 0, MAX_WIDTH + 1, MAX_WIDTH), ("rank", 0, MAX_WIDTH + 1, 1),
          ("weight_decay", -1, 11, 0)]


@pytest.mark.parametrize("name, low, high, inside", BOUNDS)
def test_each_bound_is_refused_both_ways_naming_the_field(name, low, high, inside):
    assert getattr(FitConfig(**{name: inside}), name) == inside
    for bad in (low, high, "3", True, math.inf, math.nan):
        # from_dict reads a numeric string as its number (YAML 1.1 reads 1e-3 as text)
        builds = [lambda: FitConfig(**{name: bad})]
        builds += [lambda: FitConfig.from_dict({name: bad})] if bad != "3" else []
        for build in builds:
            with pytest.raises(OptionsError, match=name) as err:
                build()
            assert err.value.field == name


def test_a_whole_float_is_an_int_and_an_unknown_key_is_named():
    assert FitConfig.from_dict({"epochs": 3.0, "lr": "1e-3"}) == FitConfig(epochs=3, lr=1e-3)
    with pytest.raises(OptionsError, match=r"unknown option depth\b"):
        FitConfig.from_dict({"depth": 3})


@pytest.mark.parametrize("override, named", [
    ("epochs=10001", "epochs must be an integer >= 1 and <= 10000"),
    ("lr=.inf", "lr must be a finite number > 0"),
    ("hidden=100000000", "hidden must be an integer >= 1 and <= 4096")])
def test_the_command_line_refuses_what_the_object_refuses(tmp_path, capsys, override, named):
    from lmforge.cli import main

    argv = ["probe", "--model", "bert-tiny", "--out", str(tmp_path / "o"), override]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("lmforge probe: error:") and named in err and len(err.splitlines()) == 1
    assert not (tmp_path / "o").exists()


def test_help_lists_the_bounds_the_object_enforces(capsys):
    from lmforge.cli import main

    with pytest.raises(SystemExit):
        main(["probe", "--help"])
    out = capsys.readouterr().out
    assert "epochs=30" in out and "[1, 10000]" in out and f"[1, {MAX_WIDTH}]" in out and "(0, 10]" in out
