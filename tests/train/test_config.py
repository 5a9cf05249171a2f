import pytest

from lmforge.cli.common import parse_overrides
from lmforge.train import TrainConfig


def test_command_line_numbers_become_numbers():
    # YAML 1.1 would keep "1e-3" a string; the command line means a number
    assert parse_overrides(["lr=1e-3", "steps=20", "schedule=cosine", "clip=null"]) == {
        "lr": 0.001, "steps": 20, "schedule": "cosine", "clip": None}
    cfg = TrainConfig.from_dict({"lr": "2e-4", "steps": "30", "warmup": 3.0, "clip": None})
    assert (cfg.lr, cfg.steps, cfg.warmup, cfg.clip) == (2e-4, 30, 3, None)
    assert isinstance(cfg.steps, int) and isinstance(cfg.warmup, int)


@pytest.mark.parametrize("data,message", [({"lr": "fast"}, "lr must be a number"),
                                          ({"steps": 2.5}, "steps must be a whole number"),
                                          ({"stpes": 3}, "unknown training option"),
                                          ({"schedule": "cubic"}, "schedule='cubic' is not one of")])
def test_bad_options_are_named(data, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig.from_dict(data)


@pytest.mark.parametrize("data,message", [
    ({"lr": "inf"}, "lr must be a finite number > 0"),
    ({"lr": "nan"}, "lr must be a finite number > 0"),
    ({"lr": 0}, "lr must be a finite number > 0"),
    ({"weight_decay": -0.1}, "weight_decay must be"),
    ({"betas": "abc"}, "betas must be two numbers"),
    ({"betas": [0.9, 1.5]}, r"betas\[1\] must be a finite number >= 0 and < 1"),
    ({"betas": [0.9]}, "betas must hold 2 numbers, got 1"),
    ({"betas": [0.9, True]}, r"betas\[1\] must be a number"),
    ({"steps": 0}, "steps must be an integer >= 1 and <= 10000000"),
    ({"steps": -3}, "steps must be an integer >= 1 and <= 10000000"),
    ({"steps": "inf"}, "steps must be a whole number"),
    ({"batch_size": 0}, "batch_size must be an integer >= 1 and <= 65536"),
    ({"eps": 0}, "eps must be"),
    ({"eps": "nan"}, "eps must be"),
    ({"min_lr_ratio": 1.5}, "min_lr_ratio must be"),
    ({"clip": -1}, "clip must be"),
    ({"warmup": -1}, "warmup must be an integer >= 0"),
    ({"seed": -1}, "seed must be an integer >= 0"),
    ({"progress": "maybe"}, "progress must be true or false"),
    ({"lr": None}, "lr must be a number"),
    ({"device": "tpu9"}, "device='tpu9' is not a device"),
])
def test_every_out_of_range_option_is_a_one_line_error_naming_it(data, message):
    with pytest.raises(ValueError, match=message) as caught:
        TrainConfig.from_dict(data)
    assert "\n" not in str(caught.value)


def test_betas_from_the_command_line():
    assert TrainConfig.from_dict(parse_overrides(["betas=[0.9,0.98]"])).betas == (0.9, 0.98)
    assert TrainConfig(betas="0.9,0.95").betas == (0.9, 0.95)
    assert TrainConfig(clip=0).clip == 0  # 0: no clipping, as None


def test_cuda_without_cuda_is_a_one_line_error(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="device='cuda' but this machine has no CUDA"):
        TrainConfig(device="cuda")


@pytest.mark.parametrize("pair,message", [("lr=", "lr= has no value"), ("lr=  ", "lr= has no value"),
                                          ("=3", "expected key=value"), ("lr", "expected key=value")])
def test_empty_overrides_are_usage_errors(pair, message):
    from lmforge.cli.common import UsageError

    with pytest.raises(UsageError, match=message):
        parse_overrides([pair])


def test_bad_options_exit_2_through_the_cli(tmp_path, capsys):
    from lmforge.cli import main

    for bad in ("lr=", "betas=abc", "lr=inf", "steps=0", "weight_decay=-1", "betas=[0.9"):
        args = ["pretrain", "--preset", "bert-tiny", "--objective", "mlm", "--out", str(tmp_path / "x"), bad]
        assert main(args) == 2, bad
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and bad.split("=")[0] in err, (bad, err)
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("warmup,steps,said", [(100, 20, "never reaches lr=0.0001 (at most 1.9e-05)"),
                                               (20, 20, "never reaches lr=0.0001 (at most 9.5e-05)"),
                                               (19, 20, "reaches lr=0.0001 at its last step only"),
                                               (18, 20, None), (0, 20, None), (0, 1, None)])
def test_a_warmup_as_long_as_the_run_is_said_in_one_line(warmup, steps, said):
    from lmforge.train.config import run_notes

    notes = run_notes(TrainConfig(steps=steps, warmup=warmup, lr=1e-4), examples=100)
    assert len(notes) == (said is not None)
    if said is not None:
        assert notes[0].startswith(f"note: warmup={warmup} ") and f"steps={steps}" in notes[0]
        assert said in notes[0]
        assert "\n" not in notes[0]


@pytest.mark.parametrize("every,steps,evaluates,said", [
    (50, 20, True, "eval_every=50 > steps=20: nothing is evaluated during this run"),
    (5, 20, False, "eval_every=5 but the run has no held-out data (eval_data) nor evaluator"),
    (20, 20, True, None), (5, 20, True, None), (0, 20, False, None)])
def test_an_eval_every_that_evaluates_nothing_is_said_in_one_line(every, steps, evaluates, said):
    from lmforge.train.config import run_notes

    notes = run_notes(TrainConfig(steps=steps, warmup=0, eval_every=every), 100, evaluates=evaluates)
    assert notes == [] if said is None else len(notes) == 1 and said in notes[0] and "\n" not in notes[0]


def test_the_help_says_how_accumulation_averages_and_where_eps_departs_from_torchs_default():
    # a token-level loss weighs every target of the step alike (test_loop's reference loop weighs each
    # micro-batch's mean by its targets); eps=1e-6 is BERT's, not AdamW's 1e-8
    import dataclasses

    helps = {f.name: f.metadata["help"] for f in dataclasses.fields(TrainConfig)}
    assert "weighs every target of the step alike" in helps["accumulation"]
    assert "1e-8" in helps["eps"] and TrainConfig().eps == 1e-6


def test_eval_every_left_out_is_a_tenth_of_the_steps_where_the_run_validates():
    """The commands had validated a fine-tuning run every tenth of its steps and Python's finetune() only at
    its end, for the same request: one rule now, where the run's steps are known (the Trainer)."""
    from lmforge.train.config import evaluated_every

    assert TrainConfig().eval_every is None
    assert evaluated_every(TrainConfig(steps=200), True).eval_every == 20
    assert evaluated_every(TrainConfig(steps=5), True).eval_every == 1  # at least every step
    assert evaluated_every(TrainConfig(steps=200), False).eval_every == 0  # nothing to validate with
    assert evaluated_every(TrainConfig(steps=200, eval_every=0), True).eval_every == 0  # given: kept
    assert evaluated_every(TrainConfig(steps=200, eval_every=7), False).eval_every == 7
