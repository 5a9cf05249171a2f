"""Reading a checkpoint back on a hostile filesystem: what is not a regular file is refused, never read."""
import os

import pytest

from lmforge.train import Trainer
from lmforge.train.checkpoint import CheckpointCorrupt, checkpoints, read_checkpoint
from tests.train.helpers import mlm_objective, quick, toy_data


@pytest.mark.parametrize("name", ["trainer.json", "model.safetensors", "optimizer.pt"])
def test_a_fifo_in_place_of_a_checkpoint_file_is_refused_naming_it_not_waited_on(tmp_path, name):
    Trainer(mlm_objective(), toy_data(8), quick(steps=2, save_every=2), tmp_path).fit()
    step = checkpoints(tmp_path / "checkpoints")[-1]
    (step / name).unlink()
    os.mkfifo(step / name)  # opening it to read would wait for a writer that never comes
    with pytest.raises(CheckpointCorrupt, match=f"{name} is not a regular file"):
        read_checkpoint(step)
