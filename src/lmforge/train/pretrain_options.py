"""The options of a pretraining run (`train.pretrain.pretrain`), beside its TrainConfig.

`RecipeOptions` holds the recipe's own key=value options (typed, bounded both ways, listed by
`lmforge options pretrain`); `PretrainInputs` what the run starts from and reads: a preset, a
checkpoint or a teacher, the corpus, a tokenizer, model config overrides, and the caller's hooks.
`recipe_and_inputs` builds both from objects and keyword arguments, so the Python face refuses
what the command line refuses: a misspelt or out-of-range field is an OptionsError naming it.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from lmforge.config.options import (OptionsError, check_options, instance_of, option, refuse_unknown,
                                    with_changes)
from lmforge.data.read_options import ReadOptions
from lmforge.utils.errors import shown

MAX_DUPLICATION = 100  # BERT's factor is 10; each copy is another corruption of every example per pass
MAX_DOCS = 10 ** 6  # the built-in corpus: ~3 sentences a document, all held and tokenized in memory
MAX_ADDED_WORDS = 1 << 16  # add_tokens: SciBERT's whole vocabulary is ~31k
DEFAULT_VOCAB = 1000  # the tokenizer trained here, unless the overrides give a vocab_size
# a client's mappings and lists, bounded before their keys are read: ModelConfig has far fewer fields than
# MAX_OVERRIDES, an objective far fewer keyword arguments than MAX_OBJECTIVE_OPTIONS; data paths are opened
# one by one (a folder among them holds any number of files)
MAX_OVERRIDES = 256
MAX_OBJECTIVE_OPTIONS = 64
MAX_DATA_PATHS = 1 << 16


@dataclass
class RecipeOptions:
    """The pretraining recipe's own key=value options (neither training options nor model config fields)."""

    add_tokens: Optional[str] = option(None, "with --model: a file of domain words, one a line (at most "
                                             f"{MAX_ADDED_WORDS}), added to the vocabulary")
    # the model's max_seq_len bounds it too, checked once the model is known (pretrain._max_len)
    max_len: Optional[int] = option(None, "tokens per example, at most the model's max_seq_len; null: "
                                          "min(max_seq_len, 128) (also --max-len)", low=2, high=1 << 20)
    duplication: int = option(0, "static masking: each example's corruption fixed in this many copies (BERT: "
                                 "10); 0: dynamic, drawn anew each epoch (RoBERTa) (also --duplication)",
                              low=0, high=MAX_DUPLICATION)
    n_docs: int = option(2000, "documents of the built-in corpus (without --data)", low=1, high=MAX_DOCS)
    objective_options: Optional[dict] = option(None, "the objective's own keyword arguments, as a bake-off "
                                                     "arm's options: {rate: 0.2}, distillation's {alpha: 0, "
                                                     "temperature: 4}; each checked by the objective",
                                                max_entries=MAX_OBJECTIVE_OPTIONS)

    def __post_init__(self) -> None:
        check_options(self)


@dataclass
class PretrainInputs:
    """What a pretraining run starts from and reads (objects and paths, not key=value options)."""

    preset: Optional[str] = option(None, "a preset to train afresh (its weights from the run's seed)")
    model: Optional[str] = option(None, "continue pretraining this checkpoint: a directory or an installed "
                                        "model")
    teacher: Optional[Any] = option(None, "a teacher objective's model (distillation), or its folder or "
                                          "installed name, read once the request is checked; its config "
                                          "is the student's")
    data: Optional[list] = option(None, "text / JSONL / gzip files or a shard directory; null: the built-in "
                                        "corpus", max_entries=MAX_DATA_PATHS)
    tokenizer: Optional[Any] = option(None, "the tokenizer; null: a checkpoint's own, the shards', or one "
                                            "trained here")
    overrides: Optional[dict] = option(None, "model config fields of the preset (vocab_size also sizes the "
                                             "tokenizer trained here)", max_entries=MAX_OVERRIDES)
    read: Optional[Any] = option(None, "how the data files become documents (a ReadOptions: JSONL field, "
                                       "bad bytes, documents per block or file); null: its defaults")
    resume: bool = option(False, "continue the newest checkpoint in the output directory")
    log: Optional[Any] = option(print, "called with each line the run reports")
    evaluator: Optional[Any] = option(None, "the Trainer's: called every eval_every steps; {'stop': True} "
                                            "ends the run")

    def __post_init__(self) -> None:
        if isinstance(self.model, Path):  # a directory given as a Path is as good as its name
            self.model = str(self.model)
        check_options(self)
        if not callable(self.log):
            raise OptionsError(f"log must be callable, got {type(self.log).__name__}", "log")
        if self.data is not None and not all(isinstance(path, (str, os.PathLike)) for path in self.data):
            bad = next(path for path in self.data if not isinstance(path, (str, os.PathLike)))
            raise OptionsError(f"data holds {type(bad).__name__} {shown(bad)}: give paths (text, JSONL or "
                               "compressed files, folders of them, or a shard folder)", "data")
        if self.read is not None and not isinstance(self.read, ReadOptions):
            raise OptionsError(f"read must be a ReadOptions or null, got {type(self.read).__name__}", "read")
        if self.evaluator is not None and not callable(self.evaluator):
            raise OptionsError(f"evaluator must be callable or null, got {type(self.evaluator).__name__}",
                               "evaluator")

    def vocab_size(self) -> int:
        """The vocabulary of a tokenizer trained here: the overrides' vocab_size, else DEFAULT_VOCAB."""
        return (self.overrides or {}).get("vocab_size", DEFAULT_VOCAB)


def _names(cls) -> list:
    return [f.name for f in dataclasses.fields(cls)]


def recipe_and_inputs(recipe: RecipeOptions | None, inputs: PretrainInputs | None, fields: dict) -> tuple:
    """(RecipeOptions, PretrainInputs): `recipe` and `inputs` (or the defaults) with the keyword
    arguments `fields` changed, each to the object whose field it is; an unknown name is an
    OptionsError naming it and the closest known ones (config.names); either object not one of its class,
    naming the argument."""
    instance_of(recipe, RecipeOptions, "recipe")  # with_changes would name it "options"
    instance_of(inputs, PretrainInputs, "inputs")
    refuse_unknown(fields, _names(RecipeOptions) + _names(PretrainInputs), "pretrain",
                   listed="help(lmforge.train.pretrain.pretrain)")  # the names run past one line
    recipe_fields = {k: v for k, v in fields.items() if k in _names(RecipeOptions)}
    input_fields = {k: v for k, v in fields.items() if k not in recipe_fields}
    return (with_changes(RecipeOptions, recipe, recipe_fields, "pretraining recipe"),
            with_changes(PretrainInputs, inputs, input_fields, "pretraining input"))


def check_read(spec, recipe: RecipeOptions, inputs: PretrainInputs) -> None:
    """An OptionsError naming a recipe option the run would not read or `spec` refuses: an objective option
    it does not take or out of its range (objectives.keywords), duplication with an objective that draws no
    corruption (clm, bilm: each copy of an example would be the same), n_docs beside data; text_field where
    no record of the JSONL data has it (NoTextField, the command line's check too), before any model is
    built."""
    from lmforge.data.text_field import check_text_field
    from lmforge.objectives.base import Objective
    from lmforge.objectives.keywords import check_keywords

    check_keywords(spec, recipe.objective_options or {}, "objective_options")
    built = getattr(spec.build, "__self__", None)  # the objective's class (a function builds prefix-lm)
    if recipe.duplication and isinstance(built, type) and built.corrupt is Objective.corrupt:
        raise OptionsError(f"duplication={recipe.duplication}: objective {spec.name} draws no corruption, so "
                           "static masking has nothing to fix and every copy would be the same; drop it",
                           "duplication")
    if not inputs.data and inputs.read is not None:
        raise OptionsError("read: says how data files are read, and none are given (the built-in corpus is "
                           "read as it is); drop it", "read")
    if inputs.data and recipe.n_docs != RecipeOptions().n_docs:
        raise OptionsError(f"n_docs={recipe.n_docs}: sizes the built-in corpus, which is not read "
                           "when data (--data) is given; drop it", "n_docs")
    check_text_field(inputs.data, inputs.read)


def check_sources(spec, inputs: PretrainInputs) -> None:
    """A ValueError where what the run starts from does not fit `spec` or itself: a teacher objective without
    a teacher, a teacher for one that takes none, a checkpoint beside a preset or a teacher, a teacher beside
    a preset or model config fields (its student is the teacher's, as it is); an OptionsError naming teacher
    for one of no usable type. Before any of them is read."""
    from lmforge import objectives
    from lmforge.model import Transformer

    teacher = inputs.teacher
    if spec.teacher and teacher is None:
        raise ValueError(f"objective {spec.name!r} needs a teacher model (teacher=, --teacher DIR)")
    if teacher is not None and not spec.teacher:
        takers = ", ".join(s.name for s in objectives.specs() if s.teacher)
        raise ValueError(f"objective {spec.name!r} takes no teacher model (teacher=, --teacher DIR, is for "
                         f"{takers})")
    if inputs.model is not None and (inputs.preset is not None or teacher is not None):
        raise ValueError("a checkpoint to continue (model=, --model) replaces a preset and a teacher: give "
                         "one")
    if teacher is not None and (inputs.preset is not None or inputs.overrides):  # as --teacher refuses them
        raise ValueError("a teacher objective builds its student from the teacher as it is: give no preset "
                         "nor model config fields with it")
    if teacher is not None and not isinstance(teacher, (str, os.PathLike, Transformer)):
        raise OptionsError(f"teacher must be a model, its folder or an installed model's name, got "
                           f"{type(teacher).__name__}", "teacher")
