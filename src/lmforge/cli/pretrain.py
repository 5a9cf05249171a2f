"""`lmforge pretrain`: pretrain a preset, continue pretraining a checkpoint, or distil a teacher."""
from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from lmforge import objectives
from lmforge.cli.common import (SEED, STEPS, UsageError, bounded, flag_named, flag_values, from_flags, note,
                                option_flags, parse_overrides, read_config_file, refuse_nested,
                                refuse_overwrite, said, tokenizer_folder, train_config, unknown_options)
from lmforge.config import ModelConfig
from lmforge.config.options import coerce
from lmforge.data.read_options import ReadOptions
from lmforge.train.checkpoint import RUN_FILES
from lmforge.train.config import TrainConfig, options_from_dict
from lmforge.train.pretrain_options import MAX_DUPLICATION, PretrainInputs, RecipeOptions

RECIPE_KEYS = tuple(f.name for f in dataclasses.fields(RecipeOptions))
NUMBER_FLAGS = ("max_len", "duplication")  # flags whose text is read as key=value's is (1e2: 100)
SOURCES = "give one of --preset NAME, --model DIR (continue pretraining a checkpoint) or --teacher DIR " \
          "(with --objective distillation: the student is every other teacher layer)"


def split_overrides(pairs: dict) -> tuple:
    """key=value overrides -> (training options, model config fields), told apart by name."""
    train_keys = {f.name for f in dataclasses.fields(TrainConfig)}
    return ({k: v for k, v in pairs.items() if k in train_keys},
            {k: v for k, v in pairs.items() if k not in train_keys})


def recipe_options(args, model: dict) -> RecipeOptions:
    """The recipe's options from key=value (taken out of the model overrides) and their flags (--max-len,
    --duplication: read as key=value's text is, so both refuse alike, naming the field); objective_options
    are pretrain()'s to check against --objective, before any model or data is read."""
    options = {key: model.pop(key) for key in RECIPE_KEYS if key in model}
    for key in RECIPE_KEYS:
        given = getattr(args, key, None)  # n_docs has no flag: key=value only
        if given is not None:
            options[key] = coerce(RecipeOptions, key, given) if key in NUMBER_FLAGS else given
    recipe = options_from_dict(RecipeOptions, options, "pretraining recipe")  # a file's 1e2, as TrainConfig's
    if recipe.add_tokens is not None and args.model is None:
        raise UsageError("add_tokens grows a checkpoint's vocabulary: give the checkpoint with --model DIR")
    return recipe


def check_vocabulary(model: dict, tokenizer, source) -> None:
    """A `vocab_size=` override sizes the tokenizer trained here; with a tokenizer given, the model's
    embeddings follow it, so another vocab_size is refused."""
    asked = model.get("vocab_size")
    if asked is not None and tokenizer is not None and asked != tokenizer.vocab_size:
        raise UsageError(f"vocab_size={asked} conflicts with the tokenizer {source} ({tokenizer.vocab_size} "
                         f"ids): the embeddings follow the tokenizer; drop vocab_size=")


def read_options(args) -> ReadOptions | None:
    """How --data's files are read (as `corpus shard` reads them), from their flags; None: the defaults."""
    read = flag_values(args, ReadOptions)
    if read and not args.data:
        flag = "--" + next(iter(read)).replace("_", "-")
        raise UsageError(f"{flag} says how --data files are read: give --data")
    return from_flags(lambda found: ReadOptions(**found), read) if read else None


def cmd_pretrain(args) -> None:
    """Pretrain with an objective; metrics, checkpoints, plots and DIR/final under --out."""
    from lmforge.data.text_field import NoTextField
    from lmforge.tokenizer import load_tokenizer
    from lmforge.train.pretrain import pretrain, rank_zero
    from lmforge.train.run_folder import run_folder

    refuse_overwrite(args.out, ("--data", args.data), ("--model", args.model), ("--teacher", args.teacher),
                     ("--tokenizer", args.tokenizer), ("--add-tokens", args.add_tokens),
                     ("--config", args.config),
                     writes=(*RUN_FILES, "tokenizer", "probes.json"))
    refuse_nested(args.out, ("--data", args.data))
    with flag_named("out", "--out", None):  # a run there already (or none to resume): before any read
        run_folder(args.out, args.resume)
    train, model = split_overrides({**read_config_file(args.config), **parse_overrides(args.overrides)})
    train = train_config(args, train)
    if sum(x is not None for x in (args.preset, args.model, args.teacher)) != 1:
        raise UsageError(SOURCES)
    recipe = recipe_options(args, model)
    unknown = sorted(set(model) - {f.name for f in dataclasses.fields(ModelConfig)})
    if unknown:  # neither a training, a recipe nor a model option: suggested from all three
        raise unknown_options(unknown, (TrainConfig, RecipeOptions, ModelConfig))
    if (args.model is not None or args.teacher is not None) and model:
        given = "--model DIR is pretrained further" if args.model else "the student is the teacher's"
        raise UsageError(f"unknown option(s) {sorted(model)} (model config fields apply to --preset only; "
                         f"{given} as it is)")
    read = read_options(args)
    tokenizer_folder("--tokenizer", args.tokenizer)  # the files after the options, as Python checks them
    tokenizer = load_tokenizer(args.tokenizer) if args.tokenizer else None
    check_vocabulary(model, tokenizer, args.tokenizer)  # (a teacher's or a checkpoint's takes no vocab_size=)
    # the teacher by its name: pretrain() reads it, with its tokenizer, once the request is checked
    inputs = PretrainInputs(preset=args.preset, model=args.model, teacher=args.teacher, data=args.data,
                            tokenizer=tokenizer, overrides=model, resume=args.resume, read=read,
                            log=note)  # notes on stderr: stdout holds the 'wrote' line
    try:
        pretrain(args.objective, args.out, train, recipe, inputs)
    except NoTextField as err:  # pretrain()'s one check of the data's field, said with the flags naming it
        raise UsageError(f"--data {err.missing}: give --text-field, the field that holds the text") from None
    rank_zero(print)(f"wrote {Path(args.out) / 'final'}")  # under torchrun every rank gets here: one line


def objective_help() -> str:
    """--objective's help: every registered objective with its summary, then the aliases. The parser is
    built on each run (cli.main), so an objective registered before then is listed and accepted."""
    listed = "; ".join(f"{s.name}: {s.summary}" if s.summary else s.name for s in objectives.specs())
    aliases = ", ".join(f"{alias}={name}" for alias, name in objectives.aliases().items())
    return f"{listed} (aliases: {aliases})" if aliases else listed


def add_parsers(sub) -> None:
    """Add pretrain to the main parser."""
    from lmforge.cli.options import options_epilog

    p = sub.add_parser("pretrain", help="pretrain a model (built-in corpus by default)",
                       epilog=options_epilog("pretrain"),
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", help="preset name (see `lmforge presets`): a fresh model, its weights from "
                                    "--seed")
    p.add_argument("--model", help="continue pretraining this checkpoint: an lmforge or Hugging Face "
                                   "directory or an installed model (all-MiniLM-L6-v2), with its own "
                                   "tokenizer; an LM head is added where it has none")
    p.add_argument("--add-tokens", dest="add_tokens", metavar="FILE",
                   help="with --model: domain words, one a line, added to the vocabulary (each new embedding "
                        "the mean of its old sub-words'); also add_tokens=FILE")
    said(p.add_argument("--max-len", dest="max_len", metavar="N", help="tokens per example; also max_len=N"),
         "min(max_seq_len, 128)")
    p.add_argument("--objective", required=True, choices=(*objectives.names(), *objectives.aliases()),
                   metavar="NAME", help=objective_help())
    p.add_argument("--teacher", help="distillation: the teacher's model directory (with its MLM head and "
                                     "tokenizer)")
    said(p.add_argument("--duplication", metavar="N",
                        help="static masking: each example's corruption fixed in this many copies (BERT: "
                             "10); 0: dynamic, drawn anew each epoch (RoBERTa); also duplication=N"),
         0, f"[0, {MAX_DUPLICATION}]")
    p.add_argument("overrides", nargs="*", help="key=value: training options or model config fields")
    p.add_argument("--config", help="YAML/JSON file of the same keys (a key=value or a flag given too wins)")
    said(p.add_argument("--data", nargs="*", help="text, JSONL or compressed (gzip, bzip2, xz) files, "
                                                  "folders of them, or a shard folder (corpus shard)"),
         "the built-in corpus")
    option_flags(p, ReadOptions, bound=True)  # how --data's text files are read
    said(p.add_argument("--tokenizer", help="tokenizer directory"),
         "train one on the corpus; with --model, the checkpoint's")
    p.add_argument("--out", required=True, help="the run's directory: checkpoints, metrics.jsonl, final/")
    p.add_argument("--steps", type=bounded(int, *STEPS), help="optimiser steps (the steps= option)")
    said(p.add_argument("--seed", type=bounded(int, *SEED),
                        help="fixes everything the run draws, initial weights included"), 0)
    p.add_argument("--resume", action="store_true", help="continue the newest checkpoint in --out")
    p.set_defaults(func=cmd_pretrain)
