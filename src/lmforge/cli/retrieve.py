"""`lmforge index` and `lmforge retrieve`: passages, BM25 and dense indexes, queries, DPR training.

    lmforge index build --passages builtin --model all-MiniLM-L6-v2 --out runs/ix
    lmforge index build --passages corpus/ --words 100 --out runs/ix          (BM25 only)
    lmforge retrieve --index runs/ix --query "Where was Migom Koudand born?" --k 5 [--method bm25]
    lmforge retrieve train --model all-MiniLM-L6-v2 --out runs/dpr --steps 200 [--questions qa.jsonl] \\
        lr=2e-5 batch_size=16 warmup=20 temperature=0.05 [--separate-encoders]
    lmforge retrieve reader --model all-MiniLM-L6-v2 --questions gcide --retriever runs/dpr/final \\
        --out runs/reader --steps 150 --k 5 [--resume]
    lmforge retrieve --index runs/ix --query "..." --reader runs/reader/final     (answers from the top k)
    lmforge retrieve --index runs/ix --query "..." --rerank runs/rerank/final --candidates 20 --k 5
                                               (a cross-encoder re-orders the top 20, the best 5 kept)
    lmforge retrieve ict --model all-MiniLM-L6-v2 --out runs/ict --steps 200      (inverse cloze warm start)
    lmforge retrieve realm --model all-MiniLM-L6-v2 --retriever runs/ict/final --out runs/realm --steps 300 \\
        --k 4 --refresh-every 50      (REALM: salient-span MLM over retrieved passages; both encoders trained)
    lmforge retrieve rag --retriever runs/dpr/final --generator bart-small --out runs/rag --steps 300 \\
        --kind token --k 5 [--num-beams 4]       (RAG: a generator reads the top k passages; exact match)

--passages: "builtin" (the built-in corpus), a passages JSONL ({"id", "title", "text"}), or text /
JSONL corpus files. --questions: "builtin", "gcide" (dictionary definitions restated with other
entries' words; needs Debian's dict-gcide) or a SQuAD JSON / QA JSONL file ("question", "answers",
"positives" or "context"). key=value options: training (TrainConfig) and the encoder (pooling, normalize,
temperature, max_length, matryoshka_dims=[384,192,96,48] for a Matryoshka loss, matryoshka_weights).
"""
from __future__ import annotations

import json
from pathlib import Path

from lmforge.cli.common import (SEED, STEPS, UsageError, bounded, existing_model, flag_named, flag_values,
                                note, option_flags, said, text_field)
from lmforge.retrieval.job_options import (MAX_HARD_NEGATIVES, IctOptions, IndexOptions, QueryOptions,
                                           RagOptions, ReaderOptions, RealmOptions)

# the help of the flags every training sub-command (train, reader, realm, ict) takes
OUT_HELP = "the run's directory: its checkpoints, metrics.jsonl and the trained model"
SEED_HELP = "fixes everything the run draws (the built-in data's split, the batches, the negatives)"
RESUME_HELP = "continue the newest checkpoint in --out"


def _options(args) -> tuple:
    """(TrainConfig fields, EncoderOptions fields) from --config and key=value; each encoder field's type and
    bounds checked here, before any file is looked at (with a model's saved options: BiEncoder.from_dir)."""
    from dataclasses import fields

    from lmforge.cli.common import parse_overrides, read_config_file, unknown_options
    from lmforge.config.options import checked_as
    from lmforge.retrieval.dpr import EncoderOptions
    from lmforge.train import TrainConfig

    options = {**read_config_file(getattr(args, "config", None)), **parse_overrides(args.overrides)}
    train_keys, enc_keys = {f.name for f in fields(TrainConfig)}, {f.name for f in fields(EncoderOptions)}
    unknown = sorted(set(options) - train_keys - enc_keys)
    if unknown:
        raise unknown_options(unknown, (EncoderOptions, TrainConfig))
    return ({k: v for k, v in options.items() if k in train_keys},
            {k: checked_as(EncoderOptions, k, v) for k, v in options.items() if k in enc_keys})


def cmd_index_build(args) -> None:
    """Build passages, BM25 and (with --model) the dense index under --out."""
    from dataclasses import asdict, fields

    from lmforge.cli.common import UsageError, flag_error, refuse_nested, refuse_overwrite
    from lmforge.config.options import OptionsError
    from lmforge.retrieval.jobs import INDEX_WRITES, build_index_dir

    index = job_options(args, IndexOptions)  # the options first: a bad one costs no file look-up
    train, encoder = _options(args)
    if train:
        raise UsageError(f"index build takes no training options ({sorted(train)})")
    refuse_overwrite(args.out, ("--passages", args.passages), ("--model", args.model), writes=INDEX_WRITES,
                     sources=("--passages", "--model"), models=())  # none held, none entered: the job's rule
    refuse_nested(args.out, ("--passages", args.passages))  # a later build would index this one's files
    check_source("--passages", args.passages)
    try:
        with flag_named("model", "--model", args.model):  # a decoder: "a DPR encoder must be ..."
            summary = build_index_dir(args.out, args.passages, args.model, args.seed, index, not args.quiet,
                                      **encoder)
    except OptionsError as err:  # an index option the build refused is said as its flag
        if err.field in {f.name for f in fields(IndexOptions)}:
            raise flag_error(err, asdict(index)) from None
        raise
    print(json.dumps(summary))


def cmd_query(args) -> None:
    """Print the top-k passages of each --query as JSON lines."""
    from lmforge.cli.common import flag_error
    from lmforge.config.options import OptionsError
    from lmforge.retrieval.jobs import query_index

    if not args.index or not args.query:
        raise UsageError("give --index DIR and --query TEXT (or a sub-command: train, reader, realm, ict, "
                         "rag)")
    options = job_options(args, QueryOptions, prefix=QUERY)  # the flags first: a bad one costs no look-up
    if args.query_candidates is not None and not args.rerank:
        raise UsageError("--candidates: give --rerank DIR too (the candidates are what it re-orders)")
    if not (Path(args.index) / "passages.jsonl").is_file():
        raise UsageError(f"--index {args.index}: no such index (no passages.jsonl; build one with "
                         f"lmforge index build)")
    _check_rerank(args)
    try:
        results = query_index(args.index, args.query, options, args.query_model, args.reader, args.rerank)
    except OptionsError as err:  # a request query_index refused, said as its flag (--k 2000, not k=2000)
        if err.field == "queries":
            raise UsageError(f"--query: {err}") from None
        if err.field in ("k", "candidates", "model"):
            raise flag_error(err, {"k": options.k, "candidates": options.candidates,
                                   "model": args.query_model}) from None
        raise
    for result in results:
        print(json.dumps(result, ensure_ascii=False))


def check_source(flag: str, given: str | None, named: tuple = ("builtin",), folder: bool = True) -> None:
    """A UsageError naming `flag` where `given` is neither one of the `named` sources nor a file (or, with
    `folder`, a folder) on disk; the job would otherwise fail on it in an OS error naming no flag."""
    path = Path(given or "")
    if given is None or given in named or path.is_file() or (folder and path.is_dir()):
        text_field(flag, [given] if flag == "--passages" else [], "a passages file has id, title and text")
        return
    kind = "file or folder" if folder else "file"
    raise UsageError(f"{flag} {given}: {'a folder, not a file' if path.is_dir() else f'no such {kind}'} "
                     f"(or {' / '.join(named)})")


def _check_rerank(args) -> None:
    """--rerank names a reranker directory (--candidates' bounds and need of it: cmd_query, before)."""
    from lmforge.pipelines.rerank import check_reranker

    if args.rerank is None:
        return
    if not Path(args.rerank).is_dir():
        raise UsageError(f"--rerank {args.rerank}: no such directory")
    try:
        check_reranker(args.rerank)  # lmforge.rerank's rule: a CrossEncoder's folder is one too
    except ValueError as err:  # OptionsError, or a Tanh CrossEncoder's activation (check_scored)
        raise UsageError(f"--rerank {args.rerank}: {err}") from None


def _train_config(args, command: str | None = None) -> tuple:
    """(TrainConfig from --seed, --steps and the training key=values, the encoder key=values); command: a
    sub-command that takes no encoder options (a UsageError naming them if given)."""
    from lmforge.cli.common import UsageError, refuse_nested, refuse_overwrite, train_config
    from lmforge.retrieval.jobs import RUN_WRITES
    from lmforge.retrieval.rag_job import GENERATORS, generator_folder
    from lmforge.train.run_folder import run_folder

    before = [f"--{name}" for name in flag_values(args, QueryOptions, QUERY)]
    if before:
        raise UsageError(f"{', '.join(before)}: a query's flags; give a sub-command's own after its name "
                         f"(retrieve {args.action} --k N)")
    train, encoder = _options(args)  # the options first: a bad one costs no file look-up
    cfg = train_config(args, train)
    if command and encoder:
        raise UsageError(f"retrieve {command} takes no encoder options ({sorted(encoder)})")
    check_source("--questions", getattr(args, "questions", None), ("builtin", "gcide"), folder=False)
    check_source("--passages", args.passages)  # the inputs' kinds first: a folder given for a file is that
    folders = (("--retriever", getattr(args, "retriever", None)),
               ("--generator", generator_folder(getattr(args, "generator", None))))  # rag's, where a folder
    refuse_overwrite(args.out, ("--model", args.model), ("--questions", getattr(args, "questions", None)),
                     ("--passages", args.passages), ("--config", getattr(args, "config", None)), *folders,
                     writes=RUN_WRITES,  # what retrieval's jobs write (index: the reader's --retriever index)
                     sources=("--model", "--questions", "--passages", *dict(folders)), models=())  # as jobs'
    refuse_nested(args.out, ("--passages", args.passages))
    with flag_named("out", "--out", None):  # a run there already (or none to resume): before any read
        run_folder(args.out, args.resume)
    for flag, folder in folders:  # before training (it failed after it)
        if folder is not None:
            existing_model(flag, folder, tuple(GENERATORS) * (flag == "--generator"))
    return cfg, encoder


def _run_arguments(parser, questions_help: str, model: bool = True) -> None:
    """The flags of the sub-commands on questions: --model (if `model`), --out, data, steps, seed, config."""
    if model:
        parser.add_argument("--model", default="all-MiniLM-L6-v2", help="encoder to start from")
    parser.add_argument("--out", required=True, help=OUT_HELP)
    parser.add_argument("--questions", default="builtin", help=questions_help)
    said(parser.add_argument("--passages", help="passages for --questions"),
         "builtin, or the file's contexts")
    parser.add_argument("--steps", type=bounded(int, *STEPS), help="optimiser steps (the steps= option)")
    said(parser.add_argument("--seed", type=bounded(int, *SEED), help=SEED_HELP), 0)
    parser.add_argument("--config", help="YAML/JSON file of key: value options (training; a retriever's "
                                         "encoder options where it takes them); one given here too wins")


def cmd_train(args) -> None:
    """Train a DPR retriever and print recall@k of BM25, the untrained and the trained encoder."""
    from lmforge.retrieval.jobs import run_train

    cfg, encoder = _train_config(args)
    with flag_named("model", "--model", args.model):  # a decoder: "a DPR encoder must be ..."
        table = run_train(args.model, args.out, cfg, args.questions, args.passages, args.hard_negatives,
                          args.resume, note, separate=args.separate_encoders, **encoder)
    for name, row in table.items():
        print(f"{name:>10}  " + "  ".join(f"{k} {v:.3f}" for k, v in row.items()))
    print(f"retriever in {args.out}/final, recall in {args.out}/recall.json")


def cmd_reader(args) -> None:
    """Train an extractive reader and print its exact match over the top-k passages."""
    from lmforge.retrieval.jobs import run_reader

    options = job_options(args, ReaderOptions)
    cfg = _train_config(args, "reader")[0]  # no encoder options
    result = run_reader(args.model, args.out, cfg, args.questions, args.passages, args.retriever, options,
                        args.resume, note)
    print(json.dumps(result))
    print(f"reader in {args.out}/final, exact match in {args.out}/reader.json")


def cmd_realm(args) -> None:
    """REALM pretraining; print the held-out spans' scores before and after."""
    from lmforge.retrieval.jobs import run_realm

    options = job_options(args, RealmOptions)
    cfg = _train_config(args, "realm")[0]  # no encoder options
    result = run_realm(args.model, args.out, cfg, args.passages, args.retriever, options, args.resume, note)
    print(json.dumps(result))
    print(f"encoder in {args.out}/final, retriever in {args.out}/retriever, scores in {args.out}/realm.json")


def cmd_ict(args) -> None:
    """Inverse cloze task warm start; print held-out in-batch accuracy before and after."""
    from lmforge.retrieval.jobs import run_ict

    options = job_options(args, IctOptions)
    cfg = _train_config(args, "ict")[0]  # no encoder options
    result = run_ict(args.model, args.out, cfg, args.passages, options, args.resume, note)
    print(json.dumps(result))
    print(f"retriever in {args.out}/final (for retrieve realm --retriever), scores in {args.out}/ict.json")


def cmd_rag(args) -> None:
    """Train RAG from a retriever and a generator; print its exact match on the held-out questions."""
    from dataclasses import asdict, fields

    from lmforge.cli.common import flag_error
    from lmforge.config.options import OptionsError
    from lmforge.retrieval.rag_job import run_rag

    options = job_options(args, RagOptions)
    cfg = _train_config(args, "rag")[0]  # a --generator folder too: before training, and never written over
    try:
        result = run_rag(args.retriever, args.out, cfg, args.questions, args.passages, args.generator,
                         options, args.resume, note)
    except OptionsError as err:  # k past the passages, max_len past the generator: said as the flag
        if err.field in {f.name for f in fields(RagOptions)}:
            raise flag_error(err, asdict(options)) from None
        raise
    row = ("kind", "k", "decoding", "num_beams", "max_new_tokens", "exact_match")
    print("  ".join(f"{name:>14}" for name in row) + "\n" + "  ".join(f"{result[name]:>14}" for name in row))
    print(f"generator in {args.out}/final, retriever in {args.out}/retriever; {args.out}/rag.json")


def _epilog(with_training: bool, encoder: bool = True) -> str:
    """The key=value options (name=default, help) for --help: training ones, encoder ones, or both, as
    `lmforge options retrieve` lists them."""
    from lmforge.cli.options import ENCODER, TRAINING, options_epilog

    return options_epilog(sections=((TRAINING,) if with_training else ()) + ((ENCODER,) if encoder else ()))


# options that are switches on the command line, said as the opposite of their default (True)
SWITCHES = {"null_document": ("--no-null-document", "leave out the empty document"),
            "separate": ("--shared-encoder", "one encoder for sentences and contexts")}
SWITCH_WORDS = {"null_document": "with --k 0 no document is left to read"}
QUERY = "query_"  # the dest prefix of `retrieve`'s own query flags (QueryOptions)


def job_flags(parser, cls, prefix: str = "") -> None:
    """The flags of a retrieval job's options (job_options.py's classes; cli.common.option_flags), its
    switches said as SWITCHES; prefix: `retrieve`'s own query flags, apart from its sub-commands'."""
    option_flags(parser, cls, prefix, SWITCHES)


def job_options(args, cls, prefix: str = ""):
    """The options object of a retrieval job's flags (the Python API takes the same); a bad value names its
    flag, in one line."""
    from lmforge.cli.common import from_flags

    return from_flags(lambda values: cls(**values), flag_values(args, cls, prefix, SWITCHES),
                      words=SWITCH_WORDS, names={name: flag for name, (flag, _) in SWITCHES.items()})


def _index_parser(sub, argparse) -> None:
    p = sub.add_parser("index", help="build a passage index (BM25, and dense with --model)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    build = p.add_subparsers(dest="action", required=True).add_parser(
        "build", help="build an index directory", epilog=_epilog(False),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    build.add_argument("--passages", default="builtin",
                       help="builtin (the built-in corpus), a passages JSONL, or corpus files")
    build.add_argument("--out", required=True, help="index directory")
    build.add_argument("--model", help="encoder for the dense index (a directory or all-MiniLM-L6-v2)")
    job_flags(build, IndexOptions)
    build.add_argument("--seed", type=bounded(int, *SEED), default=0, help="the built-in corpus's seed")
    build.add_argument("--quiet", action="store_true", help="no progress bar")
    build.add_argument("overrides", nargs="*", help="key=value encoder options (pooling, max_length, ...)")
    build.set_defaults(func=cmd_index_build)


def _reader_parser(actions, argparse) -> None:
    r = actions.add_parser("reader", help="train an extractive reader; exact match over the top-k passages",
                           epilog=_epilog(True, encoder=False),
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    _run_arguments(r, "builtin, gcide, or a SQuAD JSON / QA JSONL file")
    said(r.add_argument("--retriever", help="a trained DPR directory for the test passages"), "BM25")
    job_flags(r, ReaderOptions)
    r.add_argument("--resume", action="store_true", help=RESUME_HELP)
    r.add_argument("overrides", nargs="*", help="key=value: training options")
    r.set_defaults(func=cmd_reader)


def _corpus_arguments(p, model_help: str) -> None:
    """The options of the sub-commands that train on a passage corpus (realm, ict): start, output,
    passages, steps, seed, config, resume and key=value training options."""
    p.add_argument("--model", default="all-MiniLM-L6-v2", help=model_help)
    p.add_argument("--out", required=True, help=OUT_HELP)
    p.add_argument("--passages", default="builtin", help="the corpus: builtin, a passages JSONL or files")
    p.add_argument("--steps", type=bounded(int, *STEPS), help="optimiser steps (the steps= option)")
    said(p.add_argument("--seed", type=bounded(int, *SEED), help=SEED_HELP), 0)
    p.add_argument("--config", help="YAML/JSON file of key: value options (training; a retriever's "
                                    "encoder options where it takes them); one given here too wins")
    p.add_argument("--resume", action="store_true", help=RESUME_HELP)
    p.add_argument("overrides", nargs="*", help="key=value: training options")


def _realm_parser(actions, argparse) -> None:
    r = actions.add_parser("realm", help="REALM pretraining: salient-span MLM marginalised over "
                           "retrieved passages", epilog=_epilog(True, encoder=False),
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    _corpus_arguments(r, "the knowledge-augmented encoder to start from")
    said(r.add_argument("--retriever", help="Embed_input / Embed_doc to start from"), "--model")
    job_flags(r, RealmOptions)
    r.set_defaults(func=cmd_realm)


def _ict_parser(actions, argparse) -> None:
    r = actions.add_parser("ict", help="warm-start a retriever with the inverse cloze task (REALM's start)",
                           epilog=_epilog(True, encoder=False),
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    _corpus_arguments(r, "encoder to start from")
    job_flags(r, IctOptions)
    r.set_defaults(func=cmd_ict)


def _rag_parser(actions, argparse) -> None:
    r = actions.add_parser("rag", help="train RAG (a generator reading the top-k passages); exact match",
                           epilog=_epilog(True, encoder=False),
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    r.add_argument("--retriever", required=True, help="a retriever folder (retrieve train's DIR/final)")
    said(r.add_argument("--generator", default="bart-small", help="bart-small, bart-tiny (a BART over the "
                        "retriever's vocabulary, drawn from --seed) or a saved encoder-decoder folder"))
    _run_arguments(r, "builtin, gcide, or a SQuAD JSON / QA JSONL file", model=False)
    job_flags(r, RagOptions)
    r.add_argument("--resume", action="store_true", help=RESUME_HELP)
    r.add_argument("overrides", nargs="*", help="key=value: training options")
    r.set_defaults(func=cmd_rag, model=None)  # no --model: the retriever and generator are its inputs


def add_parsers(sub) -> None:
    """Add the index and retrieve sub-commands to the `lmforge` parser."""
    import argparse

    from lmforge.cli.options import options_epilog

    _index_parser(sub, argparse)
    p = sub.add_parser("retrieve", help="query an index, or train a retriever or reader (retrieve train, "
                       "reader, realm, ict, rag)", description=__doc__, epilog=options_epilog("retrieve"),
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--index", help="index directory (lmforge index build)")
    p.add_argument("--query", action="append", help="a question (repeat for several)")
    said(p.add_argument("--model", dest="query_model", metavar="DIR", help="query encoder"),
         "the index's model")
    p.add_argument("--reader", help="an extractive reader directory (retrieve reader): answer from the top k")
    p.add_argument("--rerank", metavar="DIR", help="a reranker (lmforge finetune --task rerank): re-order "
                   "the retriever's top --candidates and keep the best --k")
    job_flags(p, QueryOptions, prefix=QUERY)
    p.set_defaults(func=cmd_query)
    actions = p.add_subparsers(dest="action")
    _reader_parser(actions, argparse)
    _realm_parser(actions, argparse)
    _ict_parser(actions, argparse)
    _rag_parser(actions, argparse)
    t = actions.add_parser("train", help="train DPR; recall@k vs BM25 and untrained", epilog=_epilog(True),
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    _run_arguments(t, "builtin, gcide (a reverse dictionary: needs dict-gcide), or a SQuAD JSON / QA "
                      "JSONL file")
    t.add_argument("--hard-negatives", type=bounded(int, 0, MAX_HARD_NEGATIVES), default=1,
                   help="BM25 hard negatives per question")
    t.add_argument("--separate-encoders", action="store_true",
                   help="train a passage encoder of its own (DPR's two encoders), not one shared")
    t.add_argument("--resume", action="store_true", help=RESUME_HELP)
    t.add_argument("overrides", nargs="*", help="key=value: training and encoder options")
    t.set_defaults(func=cmd_train)
