"""`retrieve reader` runs on a tiny BERT: a seed fixes the run (its new heads included), and a run cut
after a checkpoint and resumed (--resume) ends bitwise where an unbroken one does."""
from __future__ import annotations

import json
import shutil

import pytest
import torch

import lmforge
from lmforge.cli import main
from lmforge.retrieval.job_options import ReaderOptions
from lmforge.retrieval.jobs import run_reader
from lmforge.train import TrainConfig
from tests.retrieval.conftest import tiny_bert

OPTIONS = ReaderOptions(max_len=64, k=3, negatives=1)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_bert(tmp_path_factory.mktemp("tiny-reader"))


def _cfg(**kw):
    return TrainConfig(**{"steps": 4, "batch_size": 4, "lr": 1e-3, "warmup": 1, "progress": False,
                          "device": "cpu", "seed": 1, **kw})


def _final(out) -> dict:
    return lmforge.load(out / "final").state_dict()


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_seed_fixes_the_reader_run(tiny, tmp_path):
    results = []
    for name in "ab":
        torch.manual_seed(len(name) * 100 + ord(name))  # each run finds the global RNG elsewhere
        results.append(run_reader(str(tiny), tmp_path / name, _cfg(steps=2), options=OPTIONS,
                                  log=lambda m: None))
    assert results[0] == results[1]
    assert _same(_final(tmp_path / "a"), _final(tmp_path / "b"))
    assert {"span-qa", "select"} <= set(lmforge.load(tmp_path / "a" / "final").heads)


def test_a_resumed_reader_run_ends_where_an_unbroken_one_does(tiny, tmp_path, capsys):
    whole = run_reader(str(tiny), tmp_path / "whole", _cfg(save_every=2), options=OPTIONS, log=lambda m: None)
    shutil.copytree(tmp_path / "whole", tmp_path / "cut")  # as if killed after the step-2 checkpoint
    checkpoints = sorted((tmp_path / "cut" / "checkpoints").iterdir())
    assert len(checkpoints) == 2
    shutil.rmtree(checkpoints[-1])
    shutil.rmtree(tmp_path / "cut" / "final")
    (tmp_path / "cut" / "reader.json").unlink()
    args = ["retrieve", "reader", "--model", str(tiny), "--out", str(tmp_path / "cut"), "--steps", "4",
            "--seed", "1", "--max-len", "64", "--k", "3", "--negatives", "1", "batch_size=4", "lr=1e-3",
            "warmup=1", "progress=false", "device=cpu", "save_every=2"]
    assert main(args) == 2  # without --resume the checkpoints are not written over
    assert "--resume" in capsys.readouterr().err
    assert main([*args, "--resume"]) == 0
    assert json.loads((tmp_path / "cut" / "reader.json").read_text()) == whole and whole["seed"] == 1
    assert _same(_final(tmp_path / "whole"), _final(tmp_path / "cut"))


def test_resume_with_nothing_to_resume_is_refused_before_the_work(tiny, tmp_path, capsys):
    assert main(["retrieve", "reader", "--model", str(tiny), "--out", str(tmp_path / "none"),
                 "--max-len", "64", "--resume"]) == 2
    err = capsys.readouterr().err
    assert "no checkpoint" in err and err.count("\n") == 1
    none = tmp_path / "none"  # refused before the work: nothing ranked, trained or written
    assert not none.exists() or not [p for p in none.rglob("*") if p.is_file()]
