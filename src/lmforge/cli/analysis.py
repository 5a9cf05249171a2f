"""`lmforge attention` (views of a model's attention) and `lmforge heads` (importance and pruning).

    lmforge attention --model DIR "The cat sat." --pair "It was tired." --out view.html --png fig.png
    lmforge heads --model runs/sst/best --data dev.jsonl --task cls --prune 0.3 --out runs/heads
"""
from __future__ import annotations

import json
from pathlib import Path

from lmforge.cli.common import integer, said


def _layers(text: str | None, model):
    """--layers "0,3,5", "2-5" or both -> the model's layers they name (analysis.attention.layer_list, as the
    server reads ?layers=); None: all."""
    from lmforge.analysis.attention import layer_list, view_depth
    from lmforge.cli.common import UsageError
    from lmforge.config.options import OptionsError

    if text is None:
        return None
    try:
        return layer_list(text, view_depth(model))
    except OptionsError as err:
        raise UsageError(f"--layers {err}") from None


def feature_layers(text: str | None, model) -> list:
    """--layers of `probe` and `features --data` -> the hidden states it selects (features.parse_layers); a
    bad one is a UsageError naming the flag once, where the library's OptionsError names the field."""
    from lmforge.analysis.features import parse_layers
    from lmforge.cli.common import UsageError, named_once
    from lmforge.config.options import OptionsError

    try:
        return parse_layers(text, model.config.n_layers + 1)
    except OptionsError as err:
        if str(err).startswith("layers: "):  # a part refused ("'x' is not a layer index"): with the whole
            raise UsageError(f"--layers {text!r}: {str(err).removeprefix('layers: ')}") from None
        raise named_once(err, "--layers") from None  # "layers '5': ...", "layers has N characters": as --text


def _heads(text: str | None):
    """--heads "0,2" -> [0, 2]; None: all."""
    from lmforge.cli.common import UsageError

    if text is None:
        return None
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"--heads {text!r}: expected head indices like 0,2") from None


def analysed_model(args) -> tuple:
    """(model, tokenizer) of --model (and --tokenizer) for probe and features; an ELMo directory gives None
    for the tokenizer: ELMo reads characters, so its features need none (and `lmforge convert` of AllenNLP
    files writes none)."""
    from lmforge.cli.tasks import check_model
    from lmforge.fast.optimize import optimize
    from lmforge.io import load, model_dir
    from lmforge.io.native import read_meta
    from lmforge.tasks.finetune import load_model

    check_model(args.model)  # named as --model, before anything is read
    path = model_dir(args.model)
    if path is not None and args.tokenizer is None:
        config = read_meta(path).get("config")
        if isinstance(config, dict) and config.get("architecture") == "elmo":
            return optimize(load(path)), None
    return load_model(args.model, args.tokenizer, seed=args.seed)


def cmd_attention(args) -> None:
    """Write the self-contained HTML view (and figures) of a model's attention on a text."""
    import sys

    from lmforge.analysis.attention import attention_maps
    from lmforge.analysis.maps import truncation_note
    from lmforge.analysis.view import write_figure, write_html
    from lmforge.cli.common import UsageError, flag_named, refuse_overwrite
    from lmforge.cli.tasks import check_model
    from lmforge.tasks.finetune import load_model

    check_model(args.model)  # named as --model, before anything is read
    if not args.out and not args.png and not args.svg:
        raise UsageError("give --out view.html and/or --png / --svg figure files")
    _figure_flags(args)
    for flag, out in (("--out", args.out), ("--png", args.png), ("--svg", args.svg)):
        refuse_overwrite(out, ("--model", args.model), ("--tokenizer", args.tokenizer), option=flag,
                         kind="file")
    model, tokenizer = load_model(args.model, args.tokenizer)
    layers = _layers(args.layers, model)
    with flag_named("pair", "--pair", None):  # the library names the field: "--pair is empty: ..."
        maps = attention_maps(model.eval(), tokenizer, args.text, pair=args.pair, layers=layers)
    maps.title = args.model  # the model as the user named it (a config's source cites its preset's paper)
    if truncation_note(maps):
        print(f"note: {truncation_note(maps)}", file=sys.stderr)
    layer, heads = args.layer, _heads(args.heads)
    if args.png or args.svg:
        _check_figure(maps, args.group, layer, heads)  # before any file is written
    if args.out:
        stats = write_html(maps, args.out)
        print(f"wrote {args.out} ({stats.get('bytes', Path(args.out).stat().st_size) / 1e6:.2f} MB)")
    for path in (args.png, args.svg):
        if path:
            write_figure(maps, path, group=args.group, layer=layer, heads=heads)
            print(f"wrote {path}")


def _figure_flags(args) -> None:
    """A UsageError, before any work, for figure flags without a figure, or a page (--out) or figure file of
    another format (so the page is never a figure's file too)."""
    from lmforge.cli.common import UsageError

    chosen = [flag for flag in ("group", "layer", "heads") if getattr(args, flag) is not None]
    if chosen and not (args.png or args.svg):  # else they would choose nothing
        raise UsageError(f"{', '.join('--' + f for f in chosen)}: they choose what a figure draws; "
                         "give --png or --svg")
    if args.out and Path(args.out).suffix.lower() not in (".html", ".htm"):  # view.png held a page
        raise UsageError(f"--out {args.out}: the page is HTML, its file must end in .html or .htm (a "
                         "picture: --png or --svg)")
    for flag, path, suffix in (("--png", args.png, ".png"), ("--svg", args.svg, ".svg")):
        if path and Path(path).suffix.lower() != suffix:
            raise UsageError(f"{flag} {path}: the figure's file must end in {suffix}")


def _check_figure(maps, group, layer, heads) -> None:
    """A UsageError naming --group, --layer or --heads where the recorded maps lack the choice."""
    from lmforge.analysis.view_figure import selection
    from lmforge.cli.common import UsageError

    try:
        selection(maps, group, layer, heads)
    except ValueError as err:
        name = str(err).split("=", 1)[0]
        raise UsageError(f"--{name} {str(err).split('=', 1)[1]}" if name in ("group", "layer", "heads")
                         else str(err)) from None


# the flags' rules in words (their bounds are HeadsOptions')
HEADS_WORDS = {"prune": "a fraction of the heads in (0, 1)",
               "until": "a ratio of the unpruned metric in (0, 1]",
               "step": "a fraction of the heads masked per level, in (0, 1)"}


def heads_options(args):
    """The HeadsOptions of the flags (run_heads takes the same object): a bad value names its flag."""
    from lmforge.analysis.head_report import HeadsOptions
    from lmforge.cli.common import UsageError, flag_values, from_flags

    if args.prune is not None and args.until is not None:  # HeadsOptions refuses it too, naming fields
        raise UsageError("give --prune FRACTION or --until RATIO, not both")
    flags = flag_values(args, HeadsOptions)
    return from_flags(lambda values: HeadsOptions(**values), flags, words=HEADS_WORDS)


def cmd_heads(args) -> None:
    """Head importance, pruning curves by importance and at random, optional physical pruning."""
    from rich.console import Console

    from lmforge.analysis.head_report import HEADS_WRITES, run_heads
    from lmforge.cli.common import UsageError, read_records, refuse_overwrite
    from lmforge.tasks.reference import saved_kind

    options = heads_options(args)
    # every run writes OUT/heads.json (and a pruning run OUT/pruned): the names run_heads itself writes
    refuse_overwrite(args.out, ("--model", args.model), ("--data", args.data),
                     ("--importance-data", args.importance_data), writes=HEADS_WRITES, sources=("--model",))
    if options.prune is not None or options.until is not None:
        from lmforge.compress.prune_report import refuse_quantised

        refuse_quantised(args.model, "--model")
    kind = saved_kind(args.model, args.task)
    if kind is None:
        raise UsageError("--task is needed: the model directory has no task.json")
    records = read_records("--data", args.data, kind, args.columns)
    extra = args.importance_data and read_records("--importance-data", args.importance_data, kind,
                                                  args.columns)
    console = Console(stderr=True)
    report = run_heads(args.model, records, args.out, kind, extra, options,
                       progress=lambda order, lv: console.print(
                           f"[{order}] {100 * lv['fraction']:.0f}% of heads pruned: {lv['metric']:.4f}"))
    _print_report(report)


def _print_report(report: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    for attention, layers in report["importance"].items():
        table = Table(title=f"head importance ({attention}; per-layer L2-normalised)")
        table.add_column("layer")
        for h in range(max(len(layer) for layer in layers)):
            table.add_column(f"h{h}", justify="right")
        for i, layer in enumerate(layers):
            table.add_row(str(i), *[f"{x:.3f}" for x in layer])
        console.print(table)
    curve = Table(title=f"{report['metric_name']} vs heads pruned")
    n = report["random"]["orders"]
    for col in ("pruned", "by importance", f"at random (mean +- sd of {n} orders)"):
        curve.add_column(col, justify="right")
    for a, b in zip(report["curves"]["importance"], report["random"]["band"]):
        curve.add_row(f"{100 * a['fraction']:.0f}%", f"{a['metric']:.4f}",
                      f"{b['mean']:.4f} +- {b['sd']:.4f}")
    console.print(curve)
    ahead = report["random"]["importance_vs_mean"]["ahead_at_every_level"]
    # plain lines by print: rich would wrap them at 80 columns where the output is piped
    print(f"importance {'is' if ahead else 'is not'} ahead of the random mean at every level")
    if "pruned" in report:
        pruned = report["pruned"]
        print(json.dumps({k: v for k, v in pruned.items() if k != "heads"}, indent=2))
        print(pruned["note"] if "note" in pruned else
              f"{pruned['level']['fraction']:.4f} of the heads removed ({_asked(pruned['asked'])}); "
              f"forward {pruned['speedup']:.2f}x as fast, side by side; model in {pruned['dir']}")


def _asked(asked: dict) -> str:
    return f"--prune {asked['prune']}" if "prune" in asked else f"--until {asked['until']}"


def add_parsers(sub) -> None:
    """Add the attention and heads sub-commands to the `lmforge` parser."""
    p = sub.add_parser("attention",
                       help="a self-contained HTML view (and PNG/SVG figures) of a model's attention")
    p.add_argument("text", help="the text to look at")
    p.add_argument("--model", required=True,
                   help="model directory (lmforge or Hugging Face) or installed package")
    p.add_argument("--pair", help="a second text (a sentence pair; an encoder-decoder's decoder input)")
    said(p.add_argument("--tokenizer", help="tokenizer directory"), "the model directory's")
    said(p.add_argument("--layers", help="layers to record, e.g. 0,3,5 or 2-5"), "all")
    p.add_argument("--out", help="the HTML file to write (.html or .htm)")
    p.add_argument("--png", help="a PNG figure of one layer's heads")
    p.add_argument("--svg", help="an SVG figure of one layer's heads")
    said(p.add_argument("--group", help="figure: self, encoder, decoder or cross"), "the first")
    said(p.add_argument("--layer", type=integer, help="figure: the layer"), "the first recorded")
    said(p.add_argument("--heads", help="figure: heads to draw, e.g. 0,2"), "all")
    p.set_defaults(func=cmd_attention)
    _heads_parser(sub)


def _heads_parser(sub) -> None:
    """`lmforge heads`: a flag per HeadsOptions field, with its help, default and bounds (it checks them)."""
    from lmforge.analysis.head_report import HeadsOptions
    from lmforge.cli.common import option_flags

    p = sub.add_parser("heads", help="head importance and pruning (Michel et al. 2019)")
    p.add_argument("--model", required=True, help="a fine-tuned model directory (with task.json)")
    p.add_argument("--data", required=True, help="labelled data the metric is measured on")
    said(p.add_argument("--task", help="task type"), "the model's task.json")
    p.add_argument("--columns", help="field=column pairs, e.g. text=sentence,label=gold")
    said(p.add_argument("--importance-data", help="labelled data importance is estimated on"), "--data")
    option_flags(p, HeadsOptions, bound=True)
    p.add_argument("--out", required=True, help="directory for heads.json, heads.png and pruned/")
    p.set_defaults(func=cmd_heads)
