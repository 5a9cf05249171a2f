"""One bound on every seed (config.options.MAX_SEED): the command line's --seed, the Python API's seed=, a
run's TrainConfig and the server's seed accept its top and refuse one past it alike."""
import argparse

import pytest
from pydantic import ValidationError

from lmforge.cli.common import SEED
from lmforge.cli.flag_types import bounded
from lmforge.config.options import MAX_SEED, OptionsError, checked_seed
from lmforge.data.synthetic import built_in_counts
from lmforge.serve.generation_schemas import GenerateRequest
from lmforge.train.config import TrainConfig


def test_the_top_seed_is_taken_by_every_face():
    """MAX_SEED itself is a seed everywhere: the flag, a run, a request, the built-in data."""
    assert bounded(int, *SEED)(str(MAX_SEED)) == MAX_SEED
    assert TrainConfig(seed=MAX_SEED).seed == MAX_SEED
    assert GenerateRequest(prompt="a", seed=MAX_SEED).seed == MAX_SEED
    assert built_in_counts(4, MAX_SEED) == (4, MAX_SEED) and checked_seed(MAX_SEED) == MAX_SEED


def test_one_past_the_top_seed_is_refused_by_every_face():
    """MAX_SEED + 1 is refused by each, naming the seed (the server: a validation error on its field)."""
    with pytest.raises(argparse.ArgumentTypeError):
        bounded(int, *SEED)(str(MAX_SEED + 1))
    with pytest.raises(OptionsError, match="seed"):
        TrainConfig(seed=MAX_SEED + 1)
    with pytest.raises(ValidationError, match="seed"):
        GenerateRequest(prompt="a", seed=MAX_SEED + 1)
    with pytest.raises(OptionsError, match="seed"):
        built_in_counts(4, MAX_SEED + 1)
    with pytest.raises(OptionsError, match="seed"):
        checked_seed(MAX_SEED + 1)  # lmforge.generate's seed= and the streamed data's
