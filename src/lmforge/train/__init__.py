"""The one training loop (see loop.py) and its parts."""
from lmforge.train.config import TrainConfig
from lmforge.train.loop import Trainer, TrainingDiverged

__all__ = ["TrainConfig", "Trainer", "TrainingDiverged"]
