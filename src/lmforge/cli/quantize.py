"""`lmforge quantize`: int8 quantisation of every Linear for CPU inference, with what it cost and bought.

    lmforge quantize --model all-MiniLM-L6-v2 --out runs/minilm-int8
    lmforge quantize --model runs/sst/best --out runs/sst-int8 --data dev.jsonl
    lmforge quantize --model runs/gpt/final --out runs/gpt-int8 --mode weight-only

dynamic: weights int8 per output channel, activations quantised at run time (encoders, batches),
the layers reading a LayerNorm smoothed first (SmoothQuant: outlier channels moved into the weights,
calibrated on --calibration text or random tokens);
weight-only: activations not quantised (decoding, where the time is reading the weights). Each layer
runs the kernel this machine measures fastest, fp32 included (the report lists the choices).
The model is saved under --out/model, quantize.json beside it; every loader reads --out itself too.
"""
from __future__ import annotations

from pathlib import Path

from lmforge.cli.common import SEED, bounded, integer, said


def _table(report: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    metric = report["before"].get("metric_name")  # the column is named by the metric: short cells
    threads = f"{report['threads']} thread{'s' * (report['threads'] != 1)}"
    table = Table(title=f"int8 {report['mode']} quantisation (forward of {report['batch'][0]} x "
                        f"{report['batch'][1]} on {threads})")
    columns = ("", "parameters", "int8 layers", "weights MB", *((metric,) if metric else ()), "forward s")
    for col in columns:
        table.add_column(col, justify="right", no_wrap=True)
    for name in ("before", "after"):
        r = report[name]
        table.add_row(name, f"{r['parameters']:,}", str(r["int8_layers"]), f"{r['bytes'] / 1e6:.1f}",
                      *((f"{r['metric']:.4f}",) if metric else ()), f"{r['seconds']:.4f}")
    Console().print(table)
    kept = sorted({k["kernel"] for k in report["kernels"]})
    bits = "" if "activation_bits" not in report else (
        f"; activations {report['activation_bits']}-bit" if report["activation_bits"] else
        f"; no activation quantised here: every layer multiplied fp32 activations by {_unquantised(kept)}, "
        "measured faster")
    if "smoothing" in report:
        smoothing = report["smoothing"]
        bits += (f", {len(smoothing['layers'])} layers smoothed (alpha {smoothing['alpha']}, "
                 f"{smoothing['calibration']})")
    stores = sorted({k["kept_in"] for k in report["kernels"] if "kept_in" in k})
    if stores:  # chosen by an earlier process on this machine: the report has no times for them
        bits += f"; kernels as measured before on this machine ({stores[0]}: delete it to measure again)"
    print(f"parameters: {report['parameters_counted']}")
    print(f"speed-up {report['speedup']:.2f}x, size {report['size_ratio']:.2f}x; "
          f"kernels chosen: {', '.join(kept)}{bits}")


# what a layer of a kernel that quantises no activation multiplies its fp32 input by (quant/int8.py): w8a32
# forms no fp32 weight: its int8 values are widened in registers, the scale applied to each sum
UNQUANTISED = {"fp32": "a dequantised fp32 copy of its weight (fp32)",
               "dequantise": "its weight dequantised to fp32 at each call (dequantise)",
               "w8a32": "its int8 weight widened to fp32 in registers, the scale applied to the sum (w8a32)"}


def _unquantised(kernels: list) -> str:
    """What the layers of `kernels` (none quantising activations) multiplied by, in words, joined by "or"."""
    from lmforge.quant.int8 import SERIAL

    ran = dict.fromkeys(k.removesuffix(SERIAL) for k in kernels)
    return " or ".join(UNQUANTISED.get(k, f"its weight through {k}") for k in ran)


def _heads(handle, size: int):
    """(the first `size` bytes of each line of a binary file, whether the line was cut there): the rest of a
    longer line is skipped, never held in memory (a file of one huge line was read whole)."""
    while True:
        head = handle.readline(size)
        if not head:
            return
        cut = len(head) == size and not head.endswith(b"\n")
        while cut and (rest := handle.readline(1 << 20)) and not rest.endswith(b"\n"):
            pass
        yield head, cut


def _calibration(path: str) -> list:
    """The first CALIBRATION_TEXTS non-empty lines of a UTF-8 text file, read no further (a huge file is not
    read whole for them), each as far as calibration reads it (smooth.text_batches: its first
    CALIBRATION_LENGTH tokens); a one-line error naming the file (and line) otherwise."""
    import codecs

    from lmforge.cli.common import UsageError
    from lmforge.compress.smooth import CALIBRATION_LENGTH, CALIBRATION_TEXTS, TOKEN_CHARS

    texts, n = [], 0
    try:
        with open(path, "rb") as handle:  # decoded a line at a time: an error names its line
            for n, (raw, cut) in enumerate(_heads(handle, 4 * CALIBRATION_LENGTH * TOKEN_CHARS), 1):
                # a character the bound cut in two is dropped, not a decoding error
                line = codecs.getincrementaldecoder("utf-8")().decode(raw, final=not cut).strip()
                texts += [line] if line else []
                if len(texts) == CALIBRATION_TEXTS:
                    break
    except OSError as err:
        raise UsageError(f"--calibration {path}: {err.strerror or err}") from None
    except UnicodeDecodeError as err:
        raise UsageError(f"--calibration {path}:{n}: not valid UTF-8 (byte 0x{err.object[err.start]:02x} at "
                         f"column {err.start + 1}); save the file as UTF-8") from None
    if not texts:
        raise UsageError(f"--calibration {path}: no text (one calibration text a line)")
    return texts


def _check(args) -> None:
    """One-line errors for options given without what they serve (their values: quantize_options)."""
    from lmforge.cli.common import UsageError, check_task

    check_task(args.task)
    if not args.data and (args.task or args.columns):
        raise UsageError(f"{'--task' if args.task else '--columns'} reads --data: give --data FILE too")
    # --smooth-alpha is judged by QuantizeOptions, as Python's is: by value (its default, or none, changes
    # nothing where weight-only smooths nothing); texts to smooth from are read by dynamic smoothing alone
    if args.calibration is not None and (args.mode != "dynamic" or args.no_smooth):
        why = "smoothing is off (--no-smooth)" if args.mode == "dynamic" else \
            "smoothing is for --mode dynamic (weight-only quantises no activations)"
        raise UsageError(f"--calibration: {why}")
    if args.no_smooth and args.smooth_alpha is not None:
        raise UsageError("--smooth-alpha and --no-smooth: smoothing is either on or off")


# the flags' rules in words (their bounds are QuantizeOptions'; the timed tokens' bound says its own), and
# the field whose flag is another name
QUANTIZE_WORDS = {"seed": f"must be in [{SEED[0]}, {SEED[1]}]"}
QUANTIZE_FLAGS = {"alpha": "--smooth-alpha"}


def quantize_options(args):
    """The QuantizeOptions of the flags (run_quantize takes the same object): a bad value names its flag."""
    from lmforge.cli.common import from_flags
    from lmforge.compress.quantize_options import QuantizeOptions
    from lmforge.compress.smooth import ALPHA

    alpha = None if args.no_smooth else ALPHA if args.smooth_alpha is None else args.smooth_alpha
    values = {"mode": args.mode, "alpha": alpha, "batch_size": args.batch_size, "seq_len": args.seq_len,
              "rounds": args.rounds, "seed": args.seed}
    return from_flags(lambda given: QuantizeOptions(**given), values, words=QUANTIZE_WORDS,
                      names=QUANTIZE_FLAGS, shown={"alpha": args.smooth_alpha})


def _task_kind(source, given: str | None) -> str | None:
    """The task kind: given, or the model's task.json's; a one-line error for an unreadable task.json."""
    import json

    from lmforge.cli.common import UsageError
    from lmforge.tasks.finetune import TASK_FILE, task_info
    from lmforge.tasks.reference import own_kind

    try:
        return given or own_kind(task_info(source))
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as err:
        raise UsageError(f"--model {source}: {TASK_FILE} is not a JSON object ({err})") from None


def cmd_quantize(args) -> None:
    """Quantise, save under --out, print the before/after table; quantize.json beside it."""
    import torch

    from lmforge.cli.common import UsageError, flag_error, named_once, read_records, refuse_overwrite
    from lmforge.compress.model_files import replaced_line
    from lmforge.compress.quantize_report import QUANTIZE_WRITES, run_quantize
    from lmforge.config.options import OptionsError
    from lmforge.io import find_model_dir

    _check(args)
    options = quantize_options(args)
    source = find_model_dir(args.model)
    refuse_overwrite(args.out, ("--model", source), ("--data", args.data),
                     ("--calibration", args.calibration), writes=QUANTIZE_WRITES, sources=("--model",))
    torch.manual_seed(options.seed)
    kind, records = _task_kind(source, args.task), None
    if args.data:
        if kind is None:
            raise UsageError("--data scores a fine-tuned model: the model directory has no task.json "
                             "(give --task)")
        records = read_records("--data", args.data, kind, args.columns)
    texts = _calibration(args.calibration) if args.calibration else None
    existed = (Path(args.out) / "model").exists()
    try:
        report = run_quantize(source, args.out, records, kind if records else None, texts, options)
    except OptionsError as err:  # the timed batch's bounds, judged once the model says its length
        if err.field == "calibration":  # the tokenizer its texts need
            raise named_once(err, "--calibration") from None
        if err.field not in ("batch_size", "rounds", "seq_len"):
            raise
        raise flag_error(err, {"batch_size": args.batch_size, "rounds": args.rounds,
                               "seq_len": args.seq_len}) from None
    _table(report)
    if existed:
        print(replaced_line(Path(args.out) / "model"))
    print(f"model in {Path(args.out) / 'model'}, report in {Path(args.out) / 'quantize.json'}")


def add_parsers(sub) -> None:
    """Add the quantize sub-command to the `lmforge` parser."""
    import argparse

    from lmforge.compress.quantize_options import QuantizeOptions
    from lmforge.compress.smooth import ALPHA
    from lmforge.config.options import bounds_text

    p = sub.add_parser("quantize",
                       help="int8 quantisation of every Linear (dynamic or weight-only), measured",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True,
                   help="a model directory (lmforge or Hugging Face) or installed model")
    p.add_argument("--out", required=True, help="directory for the model (out/model) and quantize.json")
    p.add_argument("--mode", default="dynamic", choices=("dynamic", "weight-only"),
                   help="dynamic: int8 activations too (encoders); weight-only: float activations (decoding)")
    p.add_argument("--data", help="labelled data: the task metric before and after (a fine-tuned model)")
    said(p.add_argument("--task", help="task type"), "the model's task.json")
    p.add_argument("--columns", help="field=column pairs, e.g. text=sentence,label=gold")
    said(p.add_argument("--calibration", metavar="FILE",
                        help="text, one a line (the first 512 used: compress/smooth.CALIBRATION_TEXTS), "
                             "whose activations set the smoothing"), "random tokens")
    said(p.add_argument("--smooth-alpha", type=float, metavar="A",
                        help="SmoothQuant's migration strength for the layers reading a LayerNorm (dynamic; "
                             "compress/smooth.ALPHA)"), ALPHA,
         bounds_text(QuantizeOptions.__dataclass_fields__["alpha"].metadata).strip())
    p.add_argument("--no-smooth", action="store_true", help="dynamic mode without smoothing")
    p.add_argument("--batch-size", type=bounded(int, 1, 4096), default=8,
                   help="rows of the timed forward batch (with --seq-len, at most 65,536 tokens; over the "
                        "--rounds, 2^20)")
    said(p.add_argument("--seq-len", type=integer, help="tokens per row of the timed batch"),
         "128, or the model's longest where shorter", "[1, max_seq_len]")
    p.add_argument("--rounds", type=bounded(int, 1, 1000), default=5, help="alternating timing rounds")
    said(p.add_argument("--seed", type=integer, default=0,
                        help="seed of the random tokens drawn: the timed batch, and the smoothing's "
                             "calibration without --calibration"), bounds=f"[{SEED[0]}, {SEED[1]}]")
    p.set_defaults(func=cmd_quantize)
