"""Pretraining objectives, one per file: data-side corruption, heads and loss."""
from lmforge.objectives.base import IGNORE, Loss, Objective
from lmforge.objectives.clm import CausalLM
from lmforge.objectives.mlm import MaskedLM
from lmforge.objectives.pairs import PairMLM

__all__ = ["IGNORE", "CausalLM", "Loss", "MaskedLM", "Objective", "PairMLM"]
