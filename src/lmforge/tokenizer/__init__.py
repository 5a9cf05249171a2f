"""Tokenizers of Hugging Face model directories, built on the `tokenizers` library."""
from lmforge.tokenizer.fits import check_fits, id_count
from lmforge.tokenizer.load import load_tokenizer
from lmforge.tokenizer.train import train_tokenizer
from lmforge.tokenizer.words import word_starts
from lmforge.tokenizer.wrapper import Batch, Encoding, Tokenizer, TokenizerError

__all__ = ["Batch", "Encoding", "Tokenizer", "TokenizerError", "check_fits", "id_count", "load_tokenizer",
           "train_tokenizer", "word_starts"]
