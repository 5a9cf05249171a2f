"""TrainConfig(compile=True): torch.compile'd training gives the eager losses and checkpoint names."""
import json

import pytest

from lmforge.train import Trainer
from tests.train.helpers import mlm_objective, quick, toy_data


@pytest.mark.slow
def test_compiled_training_equals_eager(tmp_path):
    losses, names = [], []
    for compiled in (False, True):
        out = tmp_path / str(compiled)
        # no dropout: compiled code draws its masks from another random stream
        objective = mlm_objective(dropout=0.0, attention_dropout=0.0)
        model = Trainer(objective, toy_data(), quick(steps=3, compile=compiled), out).fit()
        rows = [json.loads(row) for row in (out / "metrics.jsonl").read_text().splitlines()]
        losses.append([row["loss"] for row in rows])
        names.append(sorted(model.state_dict()))
    assert names[0] == names[1]  # in-place compile: checkpoints keep their names
    assert losses[1] == pytest.approx(losses[0], rel=1e-4, abs=1e-5)
