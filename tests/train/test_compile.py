"""TrainConfig(compile=True): torch.compile'd training gives the eager losses and checkpoint names."""
import json

import pytest
import torch

from lmforge.fast.optimize import optimize
from lmforge.train import Trainer
from tests.train.helpers import clm_objective, mlm_objective, quick, toy_data


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


@pytest.mark.parametrize("make", [mlm_objective, clm_objective], ids=["mlm", "clm"])
def test_a_training_step_compiles_in_one_graph(make):
    """Model, head and loss trace whole: nothing in the step reads a value back to the host."""
    torch._dynamo.reset()
    objective = optimize(make(dropout=0.0, attention_dropout=0.0))  # compiled code draws masks otherwise
    generator = torch.Generator().manual_seed(0)
    batch = objective.collate([objective.corrupt(e, generator) for e in toy_data()[:4]])
    eager = objective(batch)
    compiled = torch.compile(objective, backend="aot_eager", fullgraph=True)(batch)
    assert torch.allclose(compiled.loss, eager.loss, atol=1e-5, rtol=1e-5)
    for name, value in eager.metrics.items():
        assert torch.allclose(compiled.metrics[name], value, atol=1e-5, rtol=1e-5), name
