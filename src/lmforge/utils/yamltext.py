"""YAML text a user gives (--config files, bake-off plans), read one way everywhere: as YAML's safe loader
reads it, but with 1e-3 and 6.0e13 as the numbers they are written as (YAML 1.1 wants a dot and a signed
exponent, so plain PyYAML reads them as text, and "lr: 1e-3" would be refused as no number), and nesting
too deep for the parser as a YAMLError (one line naming the file, as every reader says it), not a
RecursionError."""
from __future__ import annotations

import re

import yaml


class _Loader(yaml.SafeLoader):
    """The safe loader with YAML 1.2's spellings of a float in exponent form."""


_Loader.add_implicit_resolver("tag:yaml.org,2002:float", re.compile(
    r"^[-+]?(?:\d+\.?\d*|\.\d+)[eE][-+]?\d+$"), list("-+0123456789."))


def load_yaml(text: str):
    """The value YAML `text` holds (safe: plain data only), exponent-form numbers read as floats."""
    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506 - _Loader is a SafeLoader
    except RecursionError:
        raise yaml.YAMLError("nested too deeply") from None
