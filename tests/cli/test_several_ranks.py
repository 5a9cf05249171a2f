"""`lmforge` under torchrun with several processes (WORLD_SIZE above 1): pretrain and finetune train with the
process group, and rank 0 alone prints their result; every other job runs in one process and is refused, in
one line naming it, exit 2, before it reads or writes anything (utils.ranks.one_process)."""
import os
import subprocess
import sys

import pytest

from lmforge.cli import SEVERAL_RANKS, main

# each job that runs in one process, as a command line that parses ("OUT": a path under the test's folder)
ONE_PROCESS = {
    "evaluate": ["evaluate", "--model", "m", "--data", "d.csv", "--out", "OUT.jsonl"],
    "distill": ["distill", "--teacher", "t", "--train", "t.csv", "--data", "d.csv", "--out", "OUT"],
    "prune": ["prune", "--model", "m", "--method", "ffn", "--sparsity", "0.5", "--data", "d", "--out", "OUT"],
    "quantize": ["quantize", "--model", "m", "--out", "OUT"],
    "embed": ["embed", "--model", "m", "--out", "OUT.npy", "hello"],
    "tokenizer train": ["tokenizer", "train", "--kind", "wordpiece", "--vocab-size", "100", "--out", "OUT"],
    "corpus shard": ["corpus", "shard", "f.txt", "--tokenizer", "t", "--out", "OUT"],
    "index build": ["index", "build", "--out", "OUT"],
    "retrieve": ["retrieve", "--index", "i", "--query", "what"],
    "retrieve train": ["retrieve", "train", "--model", "m", "--out", "OUT"],
    "retrieve reader": ["retrieve", "reader", "--model", "m", "--out", "OUT"],
    "retrieve realm": ["retrieve", "realm", "--model", "m", "--out", "OUT"],
    "retrieve ict": ["retrieve", "ict", "--model", "m", "--out", "OUT"],
    "retrieve rag": ["retrieve", "rag", "--retriever", "r", "--out", "OUT"],
    "generate": ["generate", "--model", "m", "hi"],
    "fill-mask": ["fill-mask", "--model", "m", "a [MASK]"],
    "inspect": ["inspect", "bert-tiny"],
    "presets": ["presets"],
    "convert": ["convert", "a", "OUT"],
    "demo": ["demo", "--out", "OUT"],
    "attention": ["attention", "--model", "m", "hi"],
    "heads": ["heads", "--model", "m", "--data", "d.csv", "--out", "OUT"],
    "probe": ["probe", "--model", "m", "--out", "OUT"],
    "features": ["features", "--model", "m", "--out", "OUT"],
    "serve": ["serve", "--model", "m"],
    "options": ["options"],
    "bakeoff": ["bakeoff", "--plan", "electra", "--out", "OUT"],
}


def test_every_job_is_either_one_of_several_ranks_or_refused_there():
    """A job added later falls under the rule unless it is named a job of several ranks."""
    import argparse

    from lmforge.cli import build_parser

    jobs, todo = set(), [build_parser()]
    while todo:  # every parser down the sub-commands: those with a job of their own
        parser = todo.pop()
        todo += [p for a in parser._actions if isinstance(a, argparse._SubParsersAction)
                 for p in a.choices.values()]
        if parser.get_default("func") is not None:
            jobs.add(parser.prog.removeprefix("lmforge "))
    assert jobs == set(ONE_PROCESS) | {prog.removeprefix("lmforge ") for prog in SEVERAL_RANKS}


@pytest.mark.parametrize("job", sorted(ONE_PROCESS))
def test_a_job_of_one_process_is_refused_under_several_ranks(job, tmp_path, monkeypatch, capsys):
    """Each rank would run the whole job and write the same --out: refused before anything is read or made."""
    monkeypatch.chdir(tmp_path)  # the inputs named are none of the test's
    monkeypatch.setenv("WORLD_SIZE", "2")
    argv = [arg.replace("OUT", str(tmp_path / "out")) for arg in ONE_PROCESS[job]]
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.err == f"lmforge {job}: error: {job} runs in one process: run it without torchrun " \
        "(this process is one of WORLD_SIZE=2)\n" and captured.out == ""
    assert list(tmp_path.iterdir()) == []


def test_the_command_line_exits_2_on_any_rank(tmp_path):
    """The `lmforge` command itself, as torchrun starts it (rank 1 of 2): status 2, one line, no --out."""
    env = {**os.environ, "WORLD_SIZE": "2", "RANK": "1", "PYTHONPATH": os.getcwd()}
    out = tmp_path / "q"
    command = "import sys; from lmforge.cli import main; sys.exit(main())"
    run = subprocess.run([sys.executable, "-c", command, "quantize", "--model", "bert-tiny", "--out",
                          str(out)], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2, run.stderr
    assert run.stderr.splitlines() == ["lmforge quantize: error: quantize runs in one process: run it "
                                       "without torchrun (this process is one of WORLD_SIZE=2)"]
    assert not out.exists()


@pytest.mark.parametrize("rank", [None, "0", "1"])
def test_finetune_runs_under_several_ranks_and_rank_0_alone_prints(rank, tmp_path, monkeypatch, capsys):
    """finetune trains with the process group (its rank 0 writes best/, final/, summary.json): not refused,
    and its summary and notes come from rank 0 (or a lone process) alone."""
    import lmforge.tasks.finetune as finetune

    def fake(*args, log, **kwargs):
        log("a note")
        return {"task": "cls"}

    monkeypatch.setattr(finetune, "load_model", lambda *args, **kwargs: (None, None))
    monkeypatch.setattr(finetune, "finetune", fake)
    if rank is not None:
        monkeypatch.setenv("RANK", rank)
        monkeypatch.setenv("WORLD_SIZE", "2")
    assert main(["finetune", "--model", "bert-tiny", "--builtin", "sentiment", "--builtin-size", "60",
                 "--out", str(tmp_path / "o"), "parallel=ddp"]) == 0
    captured = capsys.readouterr()
    said = rank != "1"
    assert captured.out == ('{\n  "task": "cls"\n}\n' if said else "")
    assert ("a note" in captured.err) == said


# a job of several ranks, as a command line whose input does not exist ("OUT": a path under the test's folder)
SEVERAL = {"pretrain": ["pretrain", "--preset", "bert-tiny", "--objective", "mlm", "--data", "missing.txt",
                        "--out", "OUT"],
           "finetune": ["finetune", "--model", "bert-tiny", "--task", "cls", "--train", "missing.csv",
                        "--out", "OUT"]}


@pytest.mark.parametrize("job", sorted(SEVERAL))
def test_parallel_none_under_several_ranks_is_refused_before_any_read(job, tmp_path, monkeypatch, capsys):
    """parallel=none (the default) under torchrun: no all-reduce, each rank would train a copy of its own and
    rank 0's alone be written. One line naming parallel, exit 2, before the missing input is looked at."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WORLD_SIZE", "2")
    argv = [arg.replace("OUT", str(tmp_path / "out")) for arg in SEVERAL[job]]
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith(f"lmforge {job}: error: parallel=none under torchrun (WORLD_SIZE=2): each "
                                   "process would train a copy of its own")
    assert captured.err.count("\n") == 1 and "parallel=ddp or parallel=fsdp" in captured.err
    assert captured.out == "" and list(tmp_path.iterdir()) == []
    assert main([*argv, "parallel=ddp"]) == 2  # passes the check: what is refused next is the missing input
    assert "missing" in capsys.readouterr().err
