"""evaluating(): eval mode inside the block, the module's own mode after it, an error included."""
import pytest
from torch import nn

from lmforge.utils.modes import evaluating


@pytest.mark.parametrize("training", [True, False])
def test_the_block_runs_in_eval_mode_and_the_mode_comes_back(training):
    model = nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.5)).train(training)
    with evaluating(model) as inside:
        assert inside is model and not any(m.training for m in model.modules())
    assert all(m.training == training for m in model.modules())
    with pytest.raises(RuntimeError), evaluating(model):
        raise RuntimeError("scoring failed")
    assert all(m.training == training for m in model.modules())
