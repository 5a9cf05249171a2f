"""A training step that would not fit in the memory at hand is refused before it runs (the kernel's
out-of-memory killer would end the process without a word), naming batch_size; one that fits runs."""
import pytest
import torch

import lmforge
from lmforge.train import Trainer, memory
from lmforge.train.memory import step_bytes
from tests.train.helpers import mlm_objective, quick, toy_data


def test_the_estimate_grows_with_the_batch_and_checkpointing_keeps_less():
    cfg = lmforge.get_config("bert-base")
    one, two = step_bytes(cfg, (32, 128)), step_bytes(cfg, (64, 128))
    assert two == 2 * one  # activations only: linear in the rows
    assert step_bytes(cfg, (32, 128), checkpointing=True) < one / 3  # the logits stay
    assert step_bytes(cfg, (32, 128), parameters=10**8) - one == 12 * 10**8  # grads, Adam's two moments
    # the probe's pretraining run that the kernel killed at 24 GB: far past any such machine
    assert step_bytes(lmforge.get_config("bert-tiny"), (65536, 128)) > 100 * 2**30


def test_a_step_past_the_free_memory_is_refused_before_it_runs(tmp_path, monkeypatch):
    monkeypatch.setattr(memory, "free_bytes", lambda device: 1 << 20)  # a machine with 1 MiB free
    trainer = Trainer(mlm_objective(), toy_data(), quick(steps=2, batch_size=8), tmp_path / "run")
    with pytest.raises(ValueError, match=r"^batch_size=8: a micro-batch of 8 x \d+ tokens needs about "
                                         r"[\d.]+ GiB to train, more than the 0.0 GiB free on cpu; lower "
                                         "batch_size .*, set checkpointing=true or, to run it anyway, "
                                         "memory_check=false$"):
        trainer.fit()
    assert trainer.step == 0 and not (tmp_path / "run" / "checkpoints").exists()
    unchecked = Trainer(mlm_objective(), toy_data(), quick(steps=1, batch_size=8, memory_check=False),
                        tmp_path / "anyway")
    unchecked.fit()  # the estimate errs high: a user who knows better runs it
    assert unchecked.step == 1


def test_a_step_that_fits_runs_as_before(tmp_path):
    torch.manual_seed(0)
    model = Trainer(mlm_objective(), toy_data(), quick(steps=2), tmp_path / "run").fit()
    assert (tmp_path / "run" / "final").is_dir() and model is not None


def test_the_longest_example_is_judged_not_only_the_first_batch(tmp_path, monkeypatch):
    """Fine-tuning data of every length: the first batch's short rows fitted, a later batch padded to the
    longest example would not (the kernel then killed the run, unannounced)."""
    data = toy_data()
    longest = max(len(e["input_ids"]) for e in data)
    assert memory.longest_example(data) == longest and memory.longest_example(iter(data)) == 0
    short = data + [{"input_ids": [5] * 60}]  # one long record among short ones
    seen = []
    monkeypatch.setattr(memory, "step_bytes", lambda cfg, shape, *rest: seen.append(shape) or 0)
    Trainer(mlm_objective(), short, quick(steps=1, batch_size=4), tmp_path / "run").fit()
    assert seen and seen[0][1] >= 60  # judged at the long record's length, whatever the first batch held
