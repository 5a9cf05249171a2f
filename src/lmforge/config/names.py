"""One rule for an unknown name (a config field, an option, a keyword), wherever it is refused: Python
keywords, a JSON / YAML file, a command line's key=value. The refusal is one short line naming it, the
known names closest to it (difflib) and where the whole list is, never every known name (ModelConfig's
run to over a thousand characters on one line, with no word of the n_layers meant by n_layer)."""
from __future__ import annotations

import dataclasses
import difflib

from lmforge.utils.errors import OptionsError, elided

INLINE = 90  # known names this short all together are listed in the line itself
CLIP = 30  # an unknown name is shown this long at most (a file's key can be any text)
SHOWN = 3  # unknown names shown; the rest are counted
# where each options object's whole list is (its `lmforge options KIND`), for a line that cannot hold it
LISTED = {"ModelConfig": "lmforge options model", "TrainConfig": "lmforge options pretrain",
          "TaskConfig": "lmforge options finetune", "RecipeOptions": "lmforge options pretrain",
          "FitConfig": "lmforge options probe", "DistillConfig": "lmforge options distill",
          "SparseConfig": "lmforge options prune", "EncoderOptions": "lmforge options retrieve"}
# the reference library's (transformers') names for fields lmforge names otherwise, which no spelling is
# close to (learning_rate is nothing like lr; hidden_size was read as ffn_sizes, generation's max_length as
# min_length, the opposite bound): suggested first; a tuple, the first of them the options have (a
# fine-tuning's max_length is its texts' max_len, though TaskConfig has generation's max_new_tokens too)
REFERENCE = {"learning_rate": "lr", "num_train_epochs": "epochs", "max_steps": "steps",
             "warmup_steps": "warmup", "per_device_train_batch_size": "batch_size",
             "gradient_accumulation_steps": "accumulation",
             "hidden_size": "d_model", "n_embd": "d_model", "num_hidden_layers": "n_layers",
             "num_layers": "n_layers", "n_layer": "n_layers", "num_attention_heads": "n_heads",
             "n_head": "n_heads", "intermediate_size": "d_ff", "max_position_embeddings": "max_seq_len",
             "n_positions": "max_seq_len", "hidden_dropout_prob": "dropout", "layer_norm_eps": "norm_eps",
             "attention_probs_dropout_prob": "attention_dropout", "max_length": ("max_len", "max_new_tokens")}


def close_names(name, known, n: int = 3) -> list:
    """The names of `known` closest to `name`, closest first ([] where none is close; the reference
    library's name of one first): the one source of "did you mean" for fields, options, keywords, flags
    and presets."""
    known = [str(k) for k in known]
    wanted = REFERENCE.get(name, ())
    meant = [m for m in ((wanted,) if isinstance(wanted, str) else wanted) if m in known][:1]
    return (meant + [c for c in difflib.get_close_matches(str(name), known, n=n) if c not in meant])[:n]


def listed_at(cls) -> str:
    """Where the options dataclass `cls`'s fields are all listed: its `lmforge options KIND`, else its
    help()."""
    return LISTED.get(cls.__name__) or f"help({cls.__module__}.{cls.__qualname__})"


def unknown_message(unknown, known, noun: str = "option", listed: str = "") -> str:
    """One line for the names `unknown` that are not `known`: "unknown NOUN n_layer; did you mean
    n_layers? (all: lmforge options model)". The first unknown name with a close known name gets the
    suggestion; the known names are listed where they are short, else `listed` says where they are."""
    names, known = sorted(map(str, unknown)), sorted(map(str, known))
    shown = ", ".join(elided(str(name), CLIP) for name in names[:SHOWN])
    more = f" and {len(names) - SHOWN} more" if len(names) > SHOWN else ""
    line = f"unknown {noun}{'s' if len(names) > 1 else ''} {shown}{more}"
    for name in names:
        close = close_names(name, known)
        if close:
            whose = f"{elided(str(name), CLIP)}: " if len(names) > 1 else ""
            line += f"; {whose}did you mean {', '.join(close)}?"
            break
    every = ", ".join(known) or "none"
    if len(every) <= INLINE or not listed:
        return f"{line} (known: {every})" if len(every) <= INLINE else line
    return f"{line} (all: {listed})"


def refuse_unknown(given, known, what: str = "", error=OptionsError, listed: str = "",
                   noun: str = "option") -> None:
    """`error` (one line, `unknown_message`, .field the first unknown name) where a name of `given` is not
    `known`: an options object's fields, a function's keywords, a command line's key=value options."""
    names = set(map(str, known))
    unknown = sorted(str(k) for k in given if str(k) not in names)
    if unknown:
        raise error(unknown_message(unknown, known, f"{what} {noun}" if what else noun, listed), unknown[0])


def known_names(classes, extra=(), without=()) -> set:
    """The names a job takes: the fields of its options dataclasses `classes` and the names `extra`, less
    those of `without` (set by someone else: a plan's seeds)."""
    known = {f.name for cls in classes for f in dataclasses.fields(cls)} | set(map(str, extra))
    return known - set(without)


def unknown_among(unknown, classes, extra=(), listed: str = "", without=()) -> str:
    """unknown_message's line for the names `unknown` that are none of known_names(classes, extra,
    without); the whole list is at `listed`, else at the first class's listed_at (a job's main options:
    (TaskConfig, TrainConfig, ModelConfig)'s is "lmforge options finetune")."""
    known = known_names(classes, extra, without)
    return unknown_message(unknown, known, listed=listed or listed_at(classes[0]))
