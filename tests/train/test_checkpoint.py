"""Reading a checkpoint back on a hostile filesystem: what is not a regular file is refused, never read."""
import os
import re

import pytest
import torch

from lmforge.train import Trainer
from lmforge.train.checkpoint import (CheckpointCorrupt, checkpoints, latest_checkpoint, read_checkpoint,
                                      save_checkpoint)
from tests.train.helpers import mlm_objective, quick, toy_data


@pytest.mark.parametrize("name", ["trainer.json", "model.safetensors", "optimizer.pt"])
def test_a_fifo_in_place_of_a_checkpoint_file_is_refused_naming_it_not_waited_on(tmp_path, name):
    Trainer(mlm_objective(), toy_data(8), quick(steps=2, save_every=2), tmp_path).fit()
    step = checkpoints(tmp_path / "checkpoints")[-1]
    (step / name).unlink()
    os.mkfifo(step / name)  # opening it to read would wait for a writer that never comes
    with pytest.raises(CheckpointCorrupt, match=rf"{name} is not a regular file \(a named pipe \(FIFO\)\)"):
        read_checkpoint(step)


DAMAGED = {"cut": lambda text: text[: len(text) // 2], "a list": lambda text: "[1, 2]",
           "nested too deeply": lambda text: "[" * 100_000 + "]" * 100_000}


@pytest.mark.parametrize("damage", DAMAGED)
def test_a_damaged_or_non_object_trainer_json_is_refused_naming_it_in_one_line(tmp_path, damage):
    """trainer.json was read with json.loads: JSON nested too deeply was a RecursionError traceback, a list
    said only "has no step"; each is a CheckpointCorrupt naming the file, and a resume refuses the run."""
    Trainer(mlm_objective(), toy_data(8), quick(steps=2, save_every=2), tmp_path).fit()
    step = checkpoints(tmp_path / "checkpoints")[-1]
    (step / "trainer.json").write_text(DAMAGED[damage]((step / "trainer.json").read_text()))
    said = "must hold a JSON object {...}, not list [1, 2]" if damage == "a list" else "cannot be read"
    with pytest.raises(CheckpointCorrupt, match=re.escape(f"checkpoint {step}: trainer.json {said}")) as err:
        read_checkpoint(step)
    assert len(str(err.value).splitlines()) == 1 and len(str(err.value)) < 400
    trainer = Trainer(mlm_objective(), toy_data(8), quick(steps=4), tmp_path, log=lambda line: None)
    with pytest.raises(CheckpointCorrupt, match=rf"no usable .*step-0000002: trainer.json {re.escape(said)}"):
        trainer.resume()


@pytest.mark.parametrize("steps", [2, 4])
def test_a_corrupt_checkpoint_says_falling_back_only_where_an_older_one_is_left(tmp_path, steps):
    """One checkpoint, or two both damaged: the oldest's warning said "falling back to the previous
    checkpoint" when there was none; it says there is none, and the CheckpointCorrupt follows."""
    Trainer(mlm_objective(), toy_data(8), quick(steps=steps, save_every=2, keep_last=3), tmp_path).fit()
    found = checkpoints(tmp_path / "checkpoints")
    assert len(found) == steps // 2
    for step in found:
        (step / "model.safetensors").write_bytes((step / "model.safetensors").read_bytes()[:100])
    warned = []
    with pytest.raises(CheckpointCorrupt, match="no usable checkpoint"):
        latest_checkpoint(tmp_path / "checkpoints", warn=warned.append)
    assert len(warned) == len(found) and all(w.startswith("warning: checkpoint ") for w in warned)
    assert all(w.endswith("; falling back to the previous checkpoint") for w in warned[:-1])
    assert found[0].name in warned[-1] and warned[-1].endswith("; no older one to fall back to")


def test_checkpoints_are_ordered_by_step_number_so_keep_last_keeps_the_newest(tmp_path):
    weights, state = {"w": torch.ones(2)}, {"optimizer": {}, "scheduler": {}}
    (tmp_path / "step-notes").mkdir()  # a folder of the user's, not a checkpoint: neither read nor deleted
    for step in (9_999_999, 10_000_000):  # MAX_STEPS: 8 digits, before step-9999999 as text
        save_checkpoint(tmp_path, step, weights, state, {}, keep_last=1)
    assert [p.name for p in checkpoints(tmp_path)] == ["step-10000000"]
    assert (tmp_path / "step-notes").is_dir()


def test_a_save_removes_the_partial_folders_of_saves_killed_at_other_steps(tmp_path):
    weights, state = {"w": torch.ones(2)}, {"optimizer": {}, "scheduler": {}}
    killed = tmp_path / ".step-0000003.tmp"  # a save killed at step 3; the resumed run saves at 4 only
    killed.mkdir()
    (killed / "model.safetensors").write_bytes(b"\0" * 64)
    save_checkpoint(tmp_path, 4, weights, state, {}, keep_last=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-0000004"]


def test_cuda_states_saved_on_more_devices_restore_those_this_process_sees(monkeypatch):
    """A checkpoint from a machine that saw 4 devices, resumed where 2 are visible: the first two
    states are set (set_rng_state_all would index past the last device)."""
    from lmforge.train import checkpoint

    got, states = [], checkpoint.rng_states()  # captured on this CPU machine
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", lambda states: got.extend(states))
    states["cuda"] = torch.arange(4 * 3, dtype=torch.uint8).view(4, 3)
    before = torch.get_rng_state()
    checkpoint.set_rng_states(states)
    assert [s.tolist() for s in got] == [[0, 1, 2], [3, 4, 5]]
    assert torch.equal(torch.get_rng_state(), before)
