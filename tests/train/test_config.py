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
