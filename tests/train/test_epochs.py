"""epochs= beside --steps: epochs become steps from the training set's size, the batch and the
accumulation (said in the log); both at once, or epochs that are not a positive number, are errors."""
import json
import math
import re

import pytest

from lmforge.cli import main
from lmforge.tokenizer import train_tokenizer
from lmforge.train import TrainConfig, Trainer
from lmforge.train.log import read_metrics

from tests.train.helpers import mlm_objective, toy_data

QUICK = dict(batch_size=4, lr=1e-3, warmup=1, log_every=1, progress=False)


@pytest.mark.parametrize("epochs, examples, batch, accumulation, world, steps", [
    (2, 100, 8, 2, 1, 13),  # ceil(200 / 16)
    (2, 100, 8, 2, 2, 7),  # ceil(200 / 32): every process takes its share of a step
    (0.5, 100, 8, 2, 1, 4),  # ceil(50 / 16)
    (1, 3, 8, 1, 1, 1),  # a set smaller than one batch still trains one step
])
def test_epochs_become_steps(epochs, examples, batch, accumulation, world, steps):
    cfg = TrainConfig(epochs=epochs, batch_size=batch, accumulation=accumulation)
    counted, line = cfg.for_data(examples, world)
    assert counted.steps == steps and counted.epochs is None
    assert f"epochs={epochs:g}: {steps} steps ({examples} examples" in line
    assert TrainConfig(steps=5).for_data(examples) == (TrainConfig(steps=5), None)  # steps: as given


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf"), "abc", True])
def test_epochs_must_be_a_positive_number(bad):
    with pytest.raises(ValueError, match="epochs"):
        TrainConfig.from_dict({"epochs": bad})


def test_steps_and_epochs_together_are_refused():
    with pytest.raises(ValueError, match=r"^give steps=1000 \(--steps\) or epochs=2, not both"):
        TrainConfig.from_dict({"steps": 1000, "epochs": 2})  # even the default number of steps, if given
    with pytest.raises(ValueError, match="not both"):
        TrainConfig(steps=5, epochs=2)


def test_the_trainer_runs_the_steps_of_its_epochs_and_says_so(tmp_path):
    data, said = toy_data(n=30), []
    cfg = TrainConfig(epochs=2, accumulation=2, **QUICK)
    trainer = Trainer(mlm_objective(), data, cfg, tmp_path, log=said.append)
    expected = math.ceil(2 * 30 / (4 * 2))
    assert trainer.cfg.steps == expected
    assert any(f"epochs=2: {expected} steps (30 examples, 8 per step" in line for line in said)
    trainer.fit()
    assert read_metrics(tmp_path / "metrics.jsonl")[-1]["step"] == expected
    saved = json.loads(next((tmp_path / "checkpoints").rglob("trainer.json")).read_text())
    assert saved["train"]["steps"] == expected and saved["train"]["epochs"] is None  # what was run


def test_a_resumed_run_counts_its_epochs_with_the_runs_batch(tmp_path):
    data = toy_data(n=30)
    Trainer(mlm_objective(), data, TrainConfig(epochs=1, **QUICK), tmp_path, log=lambda m: None).fit()
    later = dict(QUICK, batch_size=2)  # a new batch size is not taken on resume: the run's 4 counts
    trainer = Trainer(mlm_objective(), data, TrainConfig(epochs=2, **later), tmp_path, log=lambda m: None)
    trainer.fit(resume=True)
    assert trainer.cfg.batch_size == 4 and trainer.step == math.ceil(2 * 30 / 4)


@pytest.mark.parametrize("extra, message", [
    (["--steps", "3", "epochs=2"], "not both"),
    (["epochs=0"], "epochs must be a finite number > 0"),
    (["epochs=-2"], "epochs must be a finite number > 0"),
    (["epochs=abc"], "epochs must be a number"),
])
def test_cli_refuses_bad_epochs_in_one_line(tmp_path, capsys, extra, message):
    tokenizer = train_tokenizer(["the cat sat on the mat"] * 20, "wordpiece", 60).save(tmp_path / "tok")
    for job in (["pretrain", "--preset", "bert-tiny", "--objective", "mlm"],
                ["finetune", "--model", "bert-tiny", "--tokenizer", str(tokenizer), "--builtin",
                 "sentiment"]):
        assert main([*job, "--out", str(tmp_path / "x"), *extra]) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_cli_pretrain_trains_for_epochs(tmp_path, capsys):
    text = tmp_path / "t.txt"
    text.write_text("\n\n".join(f"The cat number {i} sat on the mat. It was happy." for i in range(40)))
    assert main(["pretrain", "--preset", "bert-tiny", "--objective", "mlm", "--data", str(text), "--out",
                 str(tmp_path / "run"), "epochs=1", "batch_size=4", "progress=false", "n_layers=1",
                 "d_model=32", "n_heads=2", "d_ff=64", "max_seq_len=64"]) == 0
    steps = int(re.search(r"epochs=1: (\d+) steps", capsys.readouterr().err).group(1))  # a note: stderr
    assert read_metrics(tmp_path / "run" / "metrics.jsonl")[-1]["step"] == steps
