"""lmforge: the Transformer language-model family from one configurable model."""
from lmforge import convert  # registers the Hugging Face format with lmforge.io
from lmforge.analysis.text_features import features
from lmforge.config import ConfigError, ModelConfig, OptionsError
from lmforge.fast.optimize import optimize
from lmforge.generate import generate
from lmforge.io import find_tokenizer, load, save
from lmforge.model import ModelOutput, Transformer, from_config
from lmforge.pipelines.embed import embed
from lmforge.pipelines.fill_mask import fill_mask
from lmforge.pipelines.rerank import rerank
from lmforge.presets import PRESETS, get_config, tiny
from lmforge.tokenizer import Tokenizer

__version__ = "0.1.0"


def load_tokenizer(path) -> Tokenizer:
    """The tokenizer of a model directory, of the model in a job's output folder, or of an installed
    model (all-MiniLM-L6-v2), as lmforge.load reads the model."""
    return find_tokenizer(path)


def build(name: str | ModelConfig, **overrides) -> Transformer:
    """A randomly initialised model from a preset name (or a ModelConfig) with field overrides (ConfigError
    for one of no effect on that model: lstm_dim on a BERT, window on dense attention)."""
    cfg = name.with_overrides(**overrides) if isinstance(name, ModelConfig) else get_config(name, **overrides)
    return from_config(cfg)


__all__ = ["ConfigError", "OptionsError", "optimize", "convert", "ModelConfig", "ModelOutput", "PRESETS",
           "Tokenizer", "Transformer", "build", "embed", "features", "fill_mask", "from_config", "generate",
           "get_config", "load", "load_tokenizer", "rerank", "save", "tiny", "__version__"]
