"""`lmforge probe` and `lmforge features` (added to the main parser by `add_parsers`).

    lmforge probe --model all-MiniLM-L6-v2 --out runs/probe              # the built-in treebank
    lmforge probe --model DIR --data ud.conllu --tasks pos,deps,distance,depth --out runs/probe
    lmforge features --model DIR --data sentences.txt --layers 4-8 --out runs/feats
    lmforge features --model DIR --task tagging --train train.conll --dev dev.conll --layers mix \\
        --out runs/ner head=mlp

`probe` caches every layer's word vectors once, runs the probes (analysis/probing.py) and writes
DIR/probe.json (every score, the summary, the baselines) and DIR/probe.png (per layer: accuracy,
selectivity, scalar-mix weights, structural scores), and prints the table. `features` writes
DIR/features.safetensors (every sentence's (layers, words, d) vectors, never pickle) and, with
--task, trains a feature-based head on the frozen features and writes DIR/metrics.json.
key=value options are the probes' training options (epochs, lr, hidden, rank, ...).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from lmforge.cli.analysis import analysed_model, feature_layers
from lmforge.cli.common import SEED, bounded, named_once, said
from lmforge.config.model import MAX_LEN
from lmforge.utils.jsontext import dumps

TASK_KINDS = {"tagging": "tagging", "classification": "cls"}  # --task -> tasks/formats.py kind


def fit_config(args):
    """The probes' FitConfig from --config and key=value options (a bad one: a usage error)."""
    from lmforge.analysis.probe_fit import FitConfig
    from lmforge.cli.common import UsageError, parse_overrides, read_config_file

    try:
        return FitConfig.from_dict({**read_config_file(args.config), **parse_overrides(args.overrides)})
    except (TypeError, ValueError) as err:  # its field kept: main names the --config file it came from
        raise UsageError(str(err), getattr(err, "field", None)) from None


def existing(path: str | None, option: str) -> str | None:
    """`path` when it names a file; a usage error naming the option otherwise."""
    from lmforge.cli.common import UsageError
    from lmforge.utils.atomic import file_kind

    if path is not None and (kind := file_kind(path)) != "a regular file":
        said = kind if kind == "no such file" else f"not a regular file ({kind})"
        raise UsageError(f"{option} {path}: {said}")
    return path


def _write_json(path: Path, data: dict) -> None:
    from lmforge.config import atomic_write_text

    atomic_write_text(path, dumps(data, indent=2) + "\n")  # a score left undefined is null, not NaN


def probe_data(args) -> dict:
    """{train, dev, test: treebank records}: the built-in treebank or a CoNLL-U file, split seeded (a
    sentence the file repeats goes whole to one split)."""
    from lmforge.cli.common import UsageError
    from lmforge.data.conllu import read_conllu
    from lmforge.data.treebank import held_out_splits, treebank_splits

    if not 0 < args.held_out < 0.5:
        raise UsageError(f"--held-out {args.held_out} must be between 0 and 0.5")
    if args.data is None:
        if args.sentences < 3:
            raise UsageError(f"--sentences {args.sentences}: the treebank needs at least 3 "
                             f"(train, dev, test)")
        return treebank_splits(args.sentences, args.seed, args.held_out)
    records = read_conllu(existing(args.data, "--data"))
    try:
        return held_out_splits(records, args.seed, args.held_out)
    except ValueError as err:
        raise UsageError(f"--data {args.data}: {err}") from None


def probe_tasks(args, records: dict) -> list:
    """The tasks asked for (all the data supports by default); one the data lacks is a usage error."""
    from lmforge.analysis.probing import TASKS, available_tasks
    from lmforge.cli.common import UsageError

    supported = available_tasks(records["train"], records["test"])
    # the built-in treebank has every kind of link, but a few sentences may draw none of one
    few = (f"the {args.sentences} sentences drawn hold no such link in train or in test (more --sentences "
           "give them)")
    if args.tasks is None:
        lacking = [t for t in TASKS if t not in supported]
        if args.data is None and lacking:
            print(f"lmforge probe: note: no {', '.join(lacking)} probe: {few}", file=sys.stderr)
        return supported
    asked = [t.strip() for t in args.tasks.split(",") if t.strip()]
    unknown = [t for t in asked if t not in TASKS]
    if not asked:  # "" probed every task, as if none were given
        raise UsageError(f"--tasks {args.tasks!r}: names no task; tasks: {', '.join(TASKS)}")
    if unknown or len(set(asked)) < len(asked):  # a task named twice would be probed twice
        raise UsageError(f"--tasks {args.tasks}: " + (f"unknown task(s) {unknown}; tasks: {', '.join(TASKS)}"
                                                      if unknown else "a task is named twice"))
    lacking = [t for t in asked if t not in supported]
    if lacking:
        why = few if args.data is None else (f"{args.data} has no such links (only the built-in treebank has "
                                             "agreement and coref links)")
        raise UsageError(f"--tasks {','.join(lacking)}: {why}")
    return asked


def probe_heads(args) -> tuple:
    """The probe heads of --heads (linear, mlp)."""
    from lmforge.analysis.probe_fit import HEADS
    from lmforge.cli.common import UsageError

    heads = tuple(h.strip() for h in args.heads.split(",") if h.strip())
    if not heads or set(heads) - set(HEADS) or len(set(heads)) < len(heads):  # twice: probed twice
        raise UsageError(f"--heads {args.heads}: choose from {', '.join(HEADS)}, each once")
    return heads


def cmd_probe(args) -> None:
    """Probe every layer of a model; probe.json, probe.png under --out; prints the table."""
    from lmforge.analysis.features import word_features
    from lmforge.analysis.probe_report import plot_probes, print_table, summary
    from lmforge.analysis.probing import probe_sweep
    from lmforge.cli.common import refuse_overwrite

    refuse_overwrite(args.out, ("--data", args.data), ("--model", args.model),
                     ("--tokenizer", args.tokenizer), ("--config", args.config),
                     writes=("probe.json", "probe.png"))
    start = time.perf_counter()
    config, heads = fit_config(args), probe_heads(args)
    records = probe_data(args)
    tasks = probe_tasks(args, records)
    _word_len(args.max_len)  # as features checks it: before any work, said as the flag
    model, tokenizer = analysed_model(args)
    _fits(args.max_len, model)
    layers = feature_layers(args.layers, model)
    stats: dict = {}
    features = {k: word_features(model, tokenizer, [r["words"] for r in v], None, args.pooling,
                                 args.batch_size, args.max_len, stats) for k, v in records.items()}
    say = (lambda task: print(f"probing {task} ...", file=sys.stderr, flush=True)) if args.progress else None
    results = probe_sweep(features, records, layers, tasks, config, args.seed, heads, not args.no_control,
                          say)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results.update(summary=summary(results), model=str(args.model), data=args.data or "built-in treebank",
                   sentences={k: len(v) for k, v in records.items()}, pooling=args.pooling, seed=args.seed,
                   config=config.__dict__, truncated_sentences=stats.get("truncated_sentences", 0),
                   seconds=time.perf_counter() - start)
    _write_json(out / "probe.json", results)
    plot_probes(results, out / "probe.png", f"{Path(str(args.model)).name}: probes per layer")
    print_table(results)
    print(dumps(results["summary"], indent=2))
    print(f"wrote {out / 'probe.json'} and {out / 'probe.png'} ({results['seconds']:.0f} s)")


def read_sentences(path: str) -> list:
    """Sentences (lists of words) of a file: CoNLL-U (.conllu), JSON lines with "words" or "text"
    (.jsonl), one sentence a line (.txt), else CoNLL (a word and its columns a line)."""
    from lmforge.data.conllu import read_conllu
    from lmforge.tasks.formats import read_rows, read_text
    from lmforge.tasks.tagging import read_conll

    suffix = Path(path).suffix.lower()
    if suffix == ".conllu":
        return [r["words"] for r in read_conllu(path)]
    if suffix == ".txt":
        sentences = [line.split() for line in read_text(path).splitlines() if line.strip()]
    elif suffix not in (".jsonl", ".json", ".ndjson"):
        sentences = [r["words"] for r in read_conll(path)]
    else:
        sentences = [_words(path, n, row) for n, row in read_rows(path)]
    if not sentences:
        raise ValueError(f"{path}: no sentences (one a line in .txt; a word a line in CoNLL)")
    return sentences


def _words(path, n: int, row: dict) -> list:
    """A JSON record's words: its "words" list (each text or a number, none blank) or its "text" split."""
    listed, text = row.get("words"), row.get("text")  # str() read a null text as the word "None"
    words = listed if isinstance(listed, list) else text.split() if isinstance(text, str) else []
    if not words:
        raise ValueError(f"{path}:{n}: no \"words\" list or \"text\" (a text) in the record")
    if not all(isinstance(w, (str, int, float)) and not isinstance(w, bool) for w in words):  # not str([..])
        raise ValueError(f"{path}:{n}: \"words\" must be a list of words (text), "
                         f"got {json.dumps(words)[:60]}")
    if blank := [i for i, w in enumerate(words) if not str(w).strip()]:  # no pieces: its features were 0
        raise ValueError(f"{path}:{n}: \"words\"[{blank[0]}] is blank: a word is more than spaces")
    return [str(w) for w in words]


def transfer_splits(args) -> dict:
    """{train, dev[, test]: records} of --train, --dev and --test for --task."""
    from lmforge.cli.common import UsageError
    from lmforge.tasks.formats import read_task_file

    if not args.train or not args.dev:
        raise UsageError(f"--task {args.task} needs --train FILE and --dev FILE")
    files = {"train": args.train, "dev": args.dev, "test": args.test}
    return {k: read_task_file(existing(f, f"--{k}"), TASK_KINDS[args.task]) for k, f in files.items() if f}


def cmd_features(args) -> None:
    """Write the features of --data; with --task, train a feature-based head and write metrics.json."""
    from lmforge.analysis.feature_transfer import transfer
    from lmforge.analysis.features import FEATURES_FILE, save_features, word_features
    from lmforge.cli.common import UsageError, refuse_overwrite

    refuse_overwrite(args.out, ("--data", args.data), ("--train", args.train), ("--dev", args.dev),
                     ("--test", args.test), ("--model", args.model), ("--tokenizer", args.tokenizer),
                     ("--config", args.config), writes=("features.json", FEATURES_FILE, "metrics.json"))
    if args.text:
        _text_features(args)
        return
    _word_flags(args)
    args.pooling = args.pooling or "first"
    if not args.data and not args.task:
        raise UsageError("give --data FILE (features to write) and/or --task with --train and --dev")
    config = fit_config(args)
    sentences = read_sentences(existing(args.data, "--data")) if args.data else None
    splits = transfer_splits(args) if args.task else None
    model, tokenizer = analysed_model(args)
    _fits(args.max_len, model)
    chosen = feature_layers(args.layers, model)  # a bad --layers fails before any work
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if sentences is not None:
        stats: dict = {}
        features = word_features(model, tokenizer, sentences, args.layers, args.pooling, args.batch_size,
                                 args.max_len, stats)
        meta = {"model": str(args.model), "data": args.data, "layers": chosen, "pooling": args.pooling,
                "sentences": len(sentences), "d": int(features[0].shape[-1]), **stats}
        file = save_features(out, features, meta)
        _write_json(out / "features.json", meta)
        print(f"wrote {file} ({len(sentences)} sentence{'s' * (len(sentences) != 1)}, layers {chosen})")
    if splits is not None:
        scores = transfer(model, tokenizer, args.task, splits, args.layers, args.pooling, args.head, config,
                          args.seed, args.batch_size, args.max_len)
        scores.update(layers=chosen, model=str(args.model), seed=args.seed)
        _write_json(out / "metrics.json", scores)
        print(json.dumps({k: scores[k] for k in ("task", "layers", "dev", "test") if k in scores}, indent=2))
        print(f"wrote {out / 'metrics.json'}")


def _word_flags(args) -> None:
    """Words (--data, --task) pool their pieces by first, mean or last, and take a layer selection, not the
    scalar mix: a UsageError naming the flag otherwise."""
    from lmforge.cli.common import UsageError

    mixing = [flag for flag, value in (("--mix-weights", args.mix_weights), ("--mix-gamma", args.mix_gamma))
              if value is not None]
    if mixing:  # else they would be ignored
        raise UsageError(f"{', '.join(mixing)}: the scalar mix is for --text with --layers mix")
    if args.pooling not in (None, "first", "mean", "last"):
        raise UsageError(f"--pooling {args.pooling}: words (--data) pool their pieces by first, mean or "
                         "last; the other poolings are for --text")
    _word_len(args.max_len)
    if args.truncate:  # else it would be ignored: a sentence past --max-len is cut anyway, and counted
        raise UsageError("--truncate: it cuts a --text; --data and --task sentences past --max-len are cut "
                         "anyway")


def _word_len(max_len) -> None:
    """A UsageError naming --max-len where it leaves no room for a word (before the model is read)."""
    from lmforge.cli.common import UsageError

    if max_len is not None and max_len < 3:
        raise UsageError(f"--max-len {max_len}: a word needs 3 tokens at least ([CLS] word [SEP])")


def _fits(max_len, model) -> None:
    """A UsageError naming --max-len where the model reads fewer positions (before any file is written)."""
    from lmforge.cli.common import flag_error
    from lmforge.config.checks import within_context
    from lmforge.config.options import OptionsError

    try:
        if not hasattr(model, "word_layers"):  # ELMo reads words: word_features refuses a max_len for it
            within_context("max_len", max_len, model.config)
    except OptionsError as err:
        raise flag_error(err, {"max_len": max_len}) from None


FLAGS = {"layers": "--layers", "mix_weights": "--mix-weights", "mix_gamma": "--mix-gamma",
         "pooling": "--pooling", "max_length": "--max-len", "truncate": "--truncate", "texts": "--text"}


def feature_options(args) -> tuple:
    """(FeatureOptions of the flags, as /features builds them; the --text texts): a bad one names its flag."""
    from lmforge.analysis.feature_options import FeatureOptions
    from lmforge.analysis.text_features import feature_texts
    from lmforge.cli.common import UsageError
    from lmforge.config.options import OptionsError

    try:
        weights = None if args.mix_weights is None else [float(w) for w in args.mix_weights.split(",")]
    except ValueError:
        raise UsageError(f"--mix-weights {args.mix_weights!r}: expected numbers like 0.5,1,2") from None
    fields = {"layers": args.layers, "mix_weights": weights, "mix_gamma": args.mix_gamma,
              "pooling": args.pooling or "none", "max_length": args.max_len,
              "truncate": args.truncate or None}
    try:  # a blank text refused by the library's rule here, before the model is read, not after
        return FeatureOptions.build(fields=fields, from_text=True), feature_texts(args.text)
    except OptionsError as err:
        raise named_once(err, FLAGS.get(err.field, err.field)) from None


def _text_features(args) -> None:
    """--text: each text's features (per token with offsets, or pooled) as OUT/features.json, the shape
    of the server's /features answer."""
    import dataclasses

    from lmforge.analysis.text_features import text_features
    from lmforge.cli.common import UsageError
    from lmforge.config.options import OptionsError

    if args.data or args.task:
        raise UsageError("give --text or --data / --task, not both")
    options, texts = feature_options(args)
    model, tokenizer = analysed_model(args)
    try:  # the model's own limits (its positions, its special tokens): named by the flag, as the options' are
        found = text_features(model, tokenizer, texts, options, args.batch_size)
    except OptionsError as err:
        raise named_once(err, FLAGS.get(err.field, err.field)) from None
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    _write_json(out / "features.json", {"model": str(args.model), "options": dataclasses.asdict(options),
                                        "data": [f.as_json(options.pooling == "none") for f in found]})
    texts = f"{len(found)} text{'s' * (len(found) != 1)}"
    print(f"wrote {out / 'features.json'} ({texts}, layers {found[0].layers})")


def _common(p, poolings=("first", "mean", "last"), pooling="first") -> None:
    p.add_argument("--model", required=True, help="model directory (lmforge or Hugging Face), installed "
                   "model (all-MiniLM-L6-v2) or preset (random init, with --tokenizer)")
    said(p.add_argument("--tokenizer", help="tokenizer directory"), "the model directory's")
    p.add_argument("--layers", default="all",
                   help="the layers: an int, a range 4-8, a list 0,3,6, all or mix (0 = embeddings)")
    said(p.add_argument("--pooling", choices=poolings, default=pooling,
                        help="how a word's pieces become one vector" + ("" if pooling else
                        " (--data: first, mean, last); --text: none (per token), mean, max, mean_max, cls, "
                        "sep, last")), None if pooling else "first with --data, none with --text")
    p.add_argument("--batch-size", type=bounded(int, 1, 65536), default=32, help="sentences per forward pass")
    said(p.add_argument("--max-len", type=bounded(int, 2, MAX_LEN),
                        help="tokens per sentence, at most the model's max_seq_len and room for one beside "
                        "its special tokens (3 for BERT)"), "the model's")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--seed", type=bounded(int, *SEED), default=0,
                   help="fixes everything the run draws: a preset's weights, the data split, the probes' "
                        "init and batches")
    p.add_argument("--config", help="YAML/JSON file of key: value training options")
    p.add_argument("overrides", nargs="*", help="key=value training options of the probes or head")


def add_parsers(sub) -> None:
    """Add the probe and features sub-commands to the `lmforge` parser."""
    from lmforge.analysis.probe_fit import FitConfig
    from lmforge.cli.options import option_lines

    epilog = "training options (key=value):\n" + "\n".join(option_lines(FitConfig))
    p = sub.add_parser("probe", help="probing classifiers and structural probes on every layer",
                       epilog=epilog, formatter_class=argparse.RawDescriptionHelpFormatter)
    _common(p)
    said(p.add_argument("--data", help="a CoNLL-U treebank"), "the built-in synthetic treebank")
    p.add_argument("--sentences", type=bounded(int, 3, 1_000_000), default=1500,
                   help="sentences of the built-in treebank")
    said(p.add_argument("--held-out", type=float, default=0.15,
                        help="share of the sentences in dev and in test each"), bounds="(0, 0.5)")
    said(p.add_argument("--tasks", help="comma list of pos, deps, agreement, coref, distance, depth"),
         "all the data supports")
    p.add_argument("--heads", default="linear,mlp", help="probe heads per layer: linear, mlp")
    p.add_argument("--no-control", action="store_true", help="skip the control tasks (and selectivity)")
    p.add_argument("--progress", action="store_true", help="name each task as it starts (on stderr)")
    p.set_defaults(func=cmd_probe)
    _feature_flags(sub.add_parser("features", help="contextual word features; a feature-based task head",
                                  epilog=epilog, formatter_class=argparse.RawDescriptionHelpFormatter))


def _feature_flags(p) -> None:
    """The flags of `lmforge features`."""
    from lmforge.analysis.feature_options import MAX_WEIGHT, POOLINGS
    from lmforge.config.model import MAX_LAYERS

    _common(p, POOLINGS, None)
    p.add_argument("--text", action="append", help="a text whose token features to write as features.json "
                   "(repeat for more; the server's /features answer)")
    p.add_argument("--mix-weights", help=f"--layers mix: the scalar mix's weights, one per hidden state (at "
                   f"most {MAX_LAYERS + 1}), each in [{-MAX_WEIGHT}, {MAX_WEIGHT}], e.g. 0,1,2")
    said(p.add_argument("--mix-gamma", type=bounded(float, -MAX_WEIGHT, MAX_WEIGHT),
                        help="--layers mix: the scalar mix's scale"), 1)
    p.add_argument("--truncate", action="store_true", help="--text: cut a text longer than --max-len")
    p.add_argument("--data", help="sentences to featurise: .conllu, .jsonl (words or text), .txt, or CoNLL")
    p.add_argument("--task", choices=tuple(TASK_KINDS), help="train a feature-based head on frozen features")
    p.add_argument("--train", help="training file (CoNLL or .jsonl for tagging; JSONL text/label for "
                                   "classification)")
    p.add_argument("--dev", help="development file (early stopping; scored)")
    p.add_argument("--test", help="held-out file (scored)")
    p.add_argument("--head", choices=("linear", "mlp"), default="linear", help="the head on the scalar mix")
    p.set_defaults(func=cmd_features)
