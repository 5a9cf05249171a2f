"""`lmforge options [KIND]`: every key=value option of a kind of job, its default, help and bounds.

The options are the fields of TrainConfig (training), TaskConfig (fine-tuning) and ModelConfig (a
preset's architecture), each declared with its help (lmforge.config.option), and the pretraining
recipe's own (RECIPE: train.pretrain_options.RecipeOptions); this module only lists them, so a new
field is listed the moment it is declared. `options_epilog` gives the same list for a sub-command's
--help (pretrain, finetune, distill, prune, retrieve and its sub-commands).
"""
from __future__ import annotations

import dataclasses
import json

from lmforge.analysis.probe_fit import FitConfig
from lmforge.compress.sparse_finetune import SCHEDULE, SparseConfig
from lmforge.compress.task_distillation import LOSS, DistillConfig
from lmforge.config import ModelConfig
from lmforge.config.options import help_rows
from lmforge.retrieval.dpr import EncoderOptions
from lmforge.tasks.finetune import TaskConfig
from lmforge.train.config import TrainConfig
from lmforge.train.pretrain_options import RecipeOptions

TRAINING = ("training options (TrainConfig)", TrainConfig)
FINETUNING = ("fine-tuning options (TaskConfig)", TaskConfig)
RECIPE = ("pretraining recipe options", RecipeOptions)  # lmforge pretrain's own key=value options
# which options each kind of command takes, in the order they are listed
SECTIONS = {
    "pretrain": (TRAINING, RECIPE, ("model config fields (ModelConfig), for --preset", ModelConfig)),
    "finetune": (TRAINING, FINETUNING, ("model config fields (ModelConfig), for a preset --model",
                                        ModelConfig)),
    "model": (("model config fields (ModelConfig): inspect, pretrain --preset, finetune with a preset",
               ModelConfig),),
}
# the other jobs' key=value options (a field that is a flag of its command, as distill's student, is left out)
PROBE = ("probe and feature-head training options (FitConfig)", FitConfig)
DISTILL = ("distillation loss options (DistillConfig)", [r for r in help_rows(DistillConfig) if r[0] in LOSS])
PRUNE = ("magnitude / movement pruning options (SparseConfig)",
         [r for r in help_rows(SparseConfig) if r[0] in SCHEDULE])
ENCODER = ("retriever encoder options (EncoderOptions)", EncoderOptions)
SECTIONS.update(probe=(PROBE,), distill=(TRAINING, DISTILL), prune=(TRAINING, FINETUNING, PRUNE),
                retrieve=(TRAINING, ENCODER))
ALL = (TRAINING, RECIPE, FINETUNING, ("model config fields (ModelConfig)", ModelConfig), PROBE, DISTILL,
       PRUNE, ENCODER)


def show(value) -> str:
    """A default as it is written on the command line (YAML: null, true, [0.9,0.999])."""
    if value is None or isinstance(value, (bool, list, tuple)):
        return json.dumps(list(value) if isinstance(value, tuple) else value, separators=(",", ":"))
    if isinstance(value, str):
        return value if value and value.strip() == value and " " not in value else json.dumps(value)
    return repr(value)


def rows(options) -> list:
    """(name, default, help with its bounds) of each field of an options dataclass (or the rows)."""
    if dataclasses.is_dataclass(options):
        return help_rows(options)
    return list(options)


def option_lines(options) -> list:
    """One line per option (see `rows`): name=default, then its help."""
    listed = [(f"{name}={show(default)}", text) for name, default, text in rows(options)]
    width = max(len(key) for key, _ in listed)
    return [f"  {key:{width}s}  {text}".rstrip() for key, text in listed]


def options_text(kind: str | None = None, sections: tuple | None = None) -> str:
    """The listing of `lmforge options KIND` (every section without a kind; sections: these ones)."""
    sections = sections if sections is not None else SECTIONS[kind] if kind else ALL
    return "\n\n".join("\n".join([f"{title}:", *option_lines(cls)]) for title, cls in sections)


def options_epilog(kind: str | None = None, sections: tuple | None = None) -> str:
    """The key=value options of a command (its SECTIONS kind, or these sections) for its --help, as `lmforge
    options KIND` lists them (needs formatter_class=argparse.RawDescriptionHelpFormatter to keep its
    lines)."""
    return f"key=value options, with their defaults:\n\n{options_text(kind, sections)}"


def cmd_options(args) -> None:
    """Print the key=value options of a kind of command, with defaults and help."""
    print(options_text(args.kind))


def add_parsers(sub) -> None:
    """Add `options` to the main parser."""
    p = sub.add_parser("options", help="list the key=value options with their defaults and help")
    p.add_argument("kind", nargs="?", choices=tuple(SECTIONS),
                   help="whose options: pretrain (training, recipe, model), finetune (training, fine-tuning, "
                        "model), model (model config fields), probe, distill (training, loss), prune "
                        "(training, fine-tuning, pruning), retrieve (training, encoder); default: every "
                        "section")
    p.set_defaults(func=cmd_options)
