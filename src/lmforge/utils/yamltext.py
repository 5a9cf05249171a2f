"""YAML text a user gives (--config files, bake-off plans), read one way everywhere: as YAML's safe loader
reads it, but with 1e-3 and 6.0e13 as the numbers they are written as (YAML 1.1 wants a dot and a signed
exponent, so plain PyYAML reads them as text, and "lr: 1e-3" would be refused as no number), and nesting
too deep for the parser as a YAMLError (one line naming the file, as every reader says it), not a
RecursionError. Refused as a YAMLError too: a key given twice in one mapping (PyYAML and json keep the last,
silently), a value that holds itself, a scalar its constructor cannot build (a date 2024-13-01, an int of
5000 digits), and aliases standing for more than MAX_VALUES values ("billion laughs": 9 aliases of 9
aliases ... are 10**9 values to any reader that walks them)."""
from __future__ import annotations

import re

import yaml

MAX_VALUES = 10 ** 6  # values a text may stand for once its aliases are expanded


class _Loader(yaml.SafeLoader):
    """The safe loader with YAML 1.2's spellings of a float in exponent form; a key given twice refused."""

    def construct_mapping(self, node, deep=False):
        """The mapping `node` holds; a YAMLError naming a key its own entries give twice (a merge key's
        entries are not its own: `<<: *base` then `lr: 1` overrides base's lr, as YAML means)."""
        if isinstance(node, yaml.MappingNode):
            seen = {}  # key -> the line it is first given on
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                if not isinstance(key, (str, int, float, type(None))):
                    continue  # a list or mapping as a key: SafeConstructor refuses it itself
                line = key_node.start_mark.line + 1
                if key in seen:  # a plain YAMLError: a ConstructorError's marks said '"<unicode string>",
                    # line 2, column 1:' and the line again with a caret, over several lines
                    lines = f"line {line}" if seen[key] == line else f"lines {seen[key]} and {line}"
                    raise yaml.YAMLError(f"key {key!r} given twice ({lines})")
                seen[key] = line
        return super().construct_mapping(node, deep=deep)


_Loader.add_implicit_resolver("tag:yaml.org,2002:float", re.compile(
    r"^[-+]?(?:\d+\.?\d*|\.\d+)[eE][-+]?\d+$"), list("-+0123456789."))


def load_yaml(text: str):
    """The value YAML `text` holds (safe: plain data only), exponent-form numbers read as floats."""
    try:
        value = yaml.load(text, Loader=_Loader)  # noqa: S506 - _Loader is a SafeLoader
        if _count(value, {}) > MAX_VALUES:
            raise yaml.YAMLError(f"its aliases stand for more than {MAX_VALUES} values")
        return value
    except RecursionError:
        raise yaml.YAMLError("nested too deeply") from None
    except ValueError as err:  # a scalar its constructor fails on (2024-13-01, an int of 5000 digits): a
        # bare ValueError named neither the file nor the key=value, and advised sys.set_int_max_str_digits
        raise yaml.YAMLError(f"a value it cannot read: {str(err).split(';')[0]}") from None


def _count(value, counted: dict) -> int:
    """How many values `value` stands for with its aliases expanded, each shared one counted once (memo
    `counted`, by id), so 10**9 is found in a few steps; a YAMLError where a value holds itself."""
    if not isinstance(value, (dict, list)):
        return 1
    if id(value) in counted:
        if counted[id(value)] is None:
            raise yaml.YAMLError("a value holds itself (an alias inside its own anchor)")
        return counted[id(value)]
    counted[id(value)] = None
    parts = [*value.keys(), *value.values()] if isinstance(value, dict) else value
    counted[id(value)] = 1 + sum(_count(part, counted) for part in parts)
    return counted[id(value)]
