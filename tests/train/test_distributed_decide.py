"""Fine-tuning's keep-best and early-stop decisions under torchrun are rank 0's on every rank
(distributed.from_root): two ranks whose own validation scores differ would part, one gathering the weights
for best/ or stopping while the other does not, and hang at the next collective."""
import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from lmforge.train import distributed

SCRIPT = textwrap.dedent("""
    import itertools, json, os, sys
    from lmforge.tasks.base import task_class
    from lmforge.tasks.finetune import TaskConfig, finetune
    from tests.tasks.core import quiet
    from tests.train.test_distributed_finetune import run_args

    rank, calls = int(os.environ["RANK"]), itertools.count(1)

    def evaluate(self, records, batch_size=64, examples=None):
        # rank 0 scores best at the first evaluation, rank 1 better at each
        n = next(calls)
        return [], {"accuracy": 1 - n / 10 if rank == 0 else n / 10}

    task_class("cls").evaluate = evaluate
    args = run_args(sys.argv[1], parallel=sys.argv[2], steps=4)
    summary = finetune(*args, task_cfg=TaskConfig(patience=2, keep_best=True), log=quiet)
    with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as f:
        json.dump(summary, f)
""")


STOP = textwrap.dedent("""
    import json, os, sys
    from lmforge.train import TrainConfig
    from lmforge.train.pretrain import pretrain

    rank, seen = int(os.environ["RANK"]), []

    def evaluator(trainer):  # says stop on rank 0 only: rank 1 alone would go on
        seen.append(trainer.step)
        return {"stop": rank == 0}

    cfg = TrainConfig(steps=4, eval_every=1, batch_size=2, parallel="ddp", log_every=1)
    pretrain("mlm", sys.argv[1], cfg, preset="bert-tiny", overrides={"n_layers": 1}, evaluator=evaluator)
    with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as f:
        json.dump({"evaluated_at": seen}, f)
""")


def _descendants(pid: int) -> list:
    """The processes below `pid` (its children, theirs, ...), read from /proc."""
    parents = {}
    for stat in os.listdir("/proc"):
        try:
            with open(f"/proc/{stat}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            parents[int(stat)] = int(fields[1])  # the field after the state: the parent's pid
        except (ValueError, OSError, IndexError):
            continue
    found, frontier = [], [pid]
    while frontier:
        frontier = [child for child, parent in parents.items() if parent in frontier]
        found += frontier
    return found


def torchrun(script, *args, timeout: float) -> subprocess.CompletedProcess:
    """Two gloo processes of `script`; a run past `timeout` (ranks hung in a collective) is killed whole."""
    env = {**os.environ, "PYTHONPATH": os.getcwd(), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
               str(script), *map(str, args)]
    with subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True) as run:
        try:
            out, err = run.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            # torchrun and its workers (each in a session of its own: a killpg would miss them, and their
            # open pipes would keep communicate waiting for ever)
            for pid in [run.pid, *_descendants(run.pid)]:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            run.communicate()
            pytest.fail(f"the ranks hung past {timeout} s (parted at a collective)")
    return subprocess.CompletedProcess(command, run.returncode, out, err)


def test_from_root_is_the_object_itself_in_one_process():
    metrics = {"accuracy": 0.5}
    assert distributed.from_root(metrics) is metrics


@pytest.mark.slow  # two processes and a gloo group: seconds; CI runs it (make test-slow)
def test_ranks_with_different_scores_keep_best_and_stop_early_as_rank_0(tmp_path):
    script = tmp_path / "decide.py"
    script.write_text(SCRIPT)
    run = torchrun(script, tmp_path / "run", "fsdp", timeout=60)
    assert run.returncode == 0, run.stderr[-3000:]
    zero, one = (json.loads((tmp_path / "run" / f"rank{r}.json").read_text()) for r in (0, 1))
    # rank 0's scores: best at step 1, none better at steps 2 and 3, so patience 2 stops at step 3 of 4
    for summary in (zero, one):
        summary.pop("seconds")  # each rank's own clock
    assert zero == one
    assert one["steps"] == 3 and one["stopped_early"] and one["best_step"] == 1
    assert one["best"] == {"accuracy": pytest.approx(0.9)}  # rank 0's, not rank 1's 0.1
    assert one["final"] == {"accuracy": pytest.approx(0.7)}
    assert (tmp_path / "run" / "best" / "model.safetensors").is_file()


@pytest.mark.slow  # two processes and a gloo group: seconds; CI runs it (make test-slow)
def test_an_evaluator_stopping_on_rank_0_alone_stops_every_rank(tmp_path):
    """Trainer.run_evaluator hands every rank rank 0's answer: an evaluator of pretrain's that says stop on
    one rank only left the other training (an all-reduce the stopped rank never joins)."""
    script = tmp_path / "stop.py"
    script.write_text(STOP)
    run = torchrun(script, tmp_path / "run", timeout=60)
    assert run.returncode == 0, run.stderr[-3000:]
    seen = [json.loads((tmp_path / "run" / f"rank{r}.json").read_text())["evaluated_at"] for r in (0, 1)]
    assert seen == [[1], [1]]  # both stopped after the first evaluation
