"""Hugging Face checkpoints in and out (see `hf.py`); one file of key maps per family."""
from lmforge.convert.hf import FAMILIES, family_of, load_hf, read_reference_weights, save_hf
from lmforge.convert.keymap import ConversionError

__all__ = ["ConversionError", "FAMILIES", "family_of", "load_hf", "read_reference_weights", "save_hf"]
