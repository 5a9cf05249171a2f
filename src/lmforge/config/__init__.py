"""The model's description (ModelConfig), its checks, and the typed options every job is built from."""
from lmforge.config.checks import ConfigError
from lmforge.utils.atomic import atomic_write_text
from lmforge.config.model import (ARCHITECTURES, BIDIRECTIONAL_ONLY, FFNS, NORMS, PATTERNS, POSITIONS,
                                  SPECIAL_TOKENS, ModelConfig)
from lmforge.config.options import OptionsError, check_options, from_dict, option

__all__ = ["ARCHITECTURES", "BIDIRECTIONAL_ONLY", "ConfigError", "FFNS", "ModelConfig", "NORMS",
           "OptionsError", "PATTERNS", "POSITIONS", "SPECIAL_TOKENS", "atomic_write_text", "check_options",
           "from_dict", "option"]
