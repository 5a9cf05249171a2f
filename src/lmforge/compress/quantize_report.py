"""`lmforge quantize`'s work: quantise a saved model, save it, and measure what it cost and bought.

Size on disk (safetensors bytes), weights (int8 ones counted), forward time of the fp32 and the
int8 model side by side in one process (rounds alternate A B A B on the same batch, so load from
elsewhere hits both alike) and, for a fine-tuned model given labelled data, the task metric.
The report is a dict, written as quantize.json.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from lmforge.compress.measure import given_data, model_bytes
from lmforge.compress.model_files import carry_sentence_files, copy_as_created, output_folder
from lmforge.compress.quantize import COUNTED, int8_layers, int8_share, parameter_count, quantize
from lmforge.compress.quantize_options import SEQ_LEN, QuantizeOptions
from lmforge.compress.smooth import CALIBRATION_TEXTS, as_batch, random_tokens, text_batches
from lmforge.config import atomic_write_text
from lmforge.config.options import OptionsError
from lmforge.fast.optimize import optimize
from lmforge.io import find_model_dir, load
from lmforge.quant.engines import QUANTISING
from lmforge.quant.int8 import SERIAL, choices
from lmforge.quant.int8_ffn import routes
from lmforge.quant.isa import activation_bits
from lmforge.tasks.finetune import TASK_FILE, encode_split, fine_tuned_task, save_model, task_info
from lmforge.tasks.reference import own_kind
from lmforge.tokenizer import load_tokenizer
from lmforge.tokenizer.load import holds_tokenizer
from lmforge.utils.atomic import replace_dir
from lmforge.utils.model_folder import record_sums
from lmforge.utils.ranks import one_process
from lmforge.utils.timing import alternating

QUANTIZE_WRITES = ("model", "quantize.json")  # what a run writes under out (lmforge quantize checks it)


def _sizes(model, path: Path | None) -> dict:
    out = {"parameters": parameter_count(model), "int8_layers": int8_layers(model),
           "int8_share": round(int8_share(model), 4)}
    if path is not None:
        out["bytes"] = model_bytes(path)  # a Hugging Face folder's .bin files where it has no safetensors
    return out


def _metric(task, records: list) -> dict:
    examples = encode_split(task, records, "data")
    predictions = task.decode(records, examples, task.outputs(examples, 64))
    name, value = next(iter(task.score(records, predictions).items()))
    return {"metric_name": name, "metric": float(value)}


def _tokenizer(source: Path, field: str):
    """The model's tokenizer, or an OptionsError naming the field that needs it (the CLI: its flag)."""
    try:
        return load_tokenizer(source)
    except (OSError, ValueError) as err:
        raise OptionsError(f"{field} needs the model's tokenizer: {err}", field) from None


def _models(source: Path, records, kind):
    """(fp32 task or None, fp32 model, int8-to-be task or None, its model): tasks where the model is
    fine-tuned and data was given."""
    if records is not None and ((source / TASK_FILE).is_file() or kind):
        # on the CPU, where the int8 kernels are (on a GPU the int8 layers would run dequantised)
        before, after = (fine_tuned_task(source, records, kind, device="cpu").eval() for _ in range(2))
        return before, before.model, after, after.model  # timed in eval mode: no dropout
    return None, load(source).eval(), None, load(source).eval()


def _options(options) -> QuantizeOptions:
    """The job's QuantizeOptions (None: the defaults); an OptionsError naming options for anything else."""
    if options is None:
        return QuantizeOptions()
    if not isinstance(options, QuantizeOptions):
        raise OptionsError(f"options must be a QuantizeOptions (or None), got {type(options).__name__}",
                           "options")
    return options


def calibration_texts(texts) -> list | None:
    """The texts smoothing is calibrated on, as `lmforge quantize --calibration` reads a file's lines: each
    stripped, the first CALIBRATION_TEXTS kept (the cost a client chooses, bounded); None: random tokens.
    An OptionsError naming calibration for a str (its characters were read as texts), an empty list (it
    calibrated on random tokens, unsaid), or an entry that is no text or blank."""
    if texts is None:
        return None
    if isinstance(texts, (str, bytes)) or not isinstance(texts, (list, tuple)):
        raise OptionsError(f"calibration must be a list of texts, got {type(texts).__name__}", "calibration")
    if not texts:
        raise OptionsError("calibration is empty: give texts, or None for random tokens", "calibration")
    for n, text in enumerate(texts[:CALIBRATION_TEXTS]):
        if not isinstance(text, str) or not text.strip():
            shown = repr(text)[:40] if isinstance(text, str) else type(text).__name__
            raise OptionsError(f"calibration[{n}] must be a non-blank text, got {shown}", "calibration")
    return [text.strip() for text in texts[:CALIBRATION_TEXTS]]


def _scored(source: Path, records, kind):
    """(records, kind) checked before any work: records (None: no metric) are scored only on a fine-tuned
    model (its task.json, or `kind`), an OptionsError naming kind where neither says the task (they were
    dropped, unsaid)."""
    if records is None:
        return None, kind
    kind = kind or own_kind(task_info(source))
    if kind is None:
        raise OptionsError("records score a fine-tuned model: the model directory has no task.json "
                           "(give kind)", "kind")
    return given_data(records, kind), kind


def timed_length(model, seq_len: int | None) -> int:
    """Tokens a row of the timed batch: seq_len, or SEQ_LEN (the model's longest where shorter) for
    None; an OptionsError naming seq_len past the model's max_seq_len."""
    limit = model.config.max_seq_len
    if seq_len is None:
        return min(SEQ_LEN, limit)
    if seq_len > limit:
        raise OptionsError(f"seq_len={seq_len}: the model reads at most {limit} tokens (its max_seq_len)",
                           "seq_len")
    return seq_len


def _carried_tokenizer(source: Path):
    """The tokenizer the int8 model carries: None for a model without one (random ids only); a damaged one
    is an error naming its file, before any work (it was left out of the int8 model unsaid)."""
    return load_tokenizer(source) if holds_tokenizer(source) else None


def _write(source: Path, int8, task, tokenizer, staging: Path) -> None:
    """The int8 model with what travels with it (tokenizer, task.json, sentence-transformers files)."""
    if task is not None:
        save_model(task, staging)
    else:
        int8.save(staging)
        if tokenizer is not None:
            tokenizer.save(staging)
        if (source / TASK_FILE).is_file():  # a fine-tuned model stays one (lmforge evaluate reads it)
            copy_as_created(source / TASK_FILE, staging / TASK_FILE)
            record_sums(staging, [TASK_FILE])  # as read verified from the source (run_quantize, first)
    carry_sentence_files(source, staging)


def _report(mode: str, fp32, int8, source: Path, batch: dict, rounds: int) -> dict:
    """Sizes and forward seconds of both models, timed side by side on `batch` (smooth.as_batch)."""
    # both timed as the jobs run them: optimized (fast/optimize.py; the int8 FFN's fused route is there)
    optimize(fp32)
    optimize(int8)
    seconds = alternating({"before": lambda: fp32(**batch), "after": lambda: int8(**batch)}, rounds)
    ids = batch["input_ids"]
    return {"mode": mode, "batch": [int(ids.shape[0]), int(ids.shape[1])], "threads": torch.get_num_threads(),
            "parameters_counted": COUNTED,
            "before": {**_sizes(fp32, source), "seconds": seconds["before"]},
            "after": {**_sizes(int8, None), "seconds": seconds["after"]},
            "speedup": seconds["before"] / seconds["after"]}


def _source(model) -> Path:
    """The model directory `model` names; an OptionsError naming model where none (as run_prune's)."""
    try:
        return find_model_dir(model)
    except ValueError as err:
        raise OptionsError(str(err), "model") from None


def quantised_bits(kernels: list, ffn_routes: list) -> int | None:
    """The activations' bits (8 under VNNI, else 7: quant/isa.py) where any layer quantised them: its kernel
    one of QUANTISING, or its FFN on the fused route (the hidden units quantised in one pass, whatever
    kernels the layers ran alone); None where none did (every layer read fp32 input: fp32, w8a32)."""
    quantising = any(k["kernel"].removesuffix(SERIAL) in QUANTISING for k in kernels)
    return activation_bits() if quantising or any(r["route"] == "fused" for r in ffn_routes) else None


def run_quantize(model, out, records: list | None = None, kind: str | None = None,
                 calibration: list | None = None, options: QuantizeOptions | None = None) -> dict:
    """Quantise the model at `model` (a directory or installed model), measure sizes, speed side by
    side and (with `records`) the task metric before and after, then save it under out/model and
    the report as out/quantize.json (nothing written unless all of it succeeded); calibration:
    texts to smooth from (None: random tokens drawn from the options' seed, as the timed batch is)."""
    one_process("run_quantize")
    o, calibration = _options(options), calibration_texts(calibration)
    source = _source(model)
    out = output_folder(out, source, QUANTIZE_WRITES)  # before any work, as --out is
    records, kind = _scored(source, records, kind)
    task_before, fp32, task_after, int8 = _models(source, records, kind)
    tokenizer = _carried_tokenizer(source)  # what travels with the int8 model, read verified before any work
    task_info(source)  # its task.json too (copied below): a changed one is refused here, not carried
    length = timed_length(fp32, o.seq_len)
    o.check_timed(length)  # before any work: the default length is the model's (at most SEQ_LEN)
    ids, mask = random_tokens(fp32, o.batch_size, length, o.seed)
    batches = text_batches(fp32, _tokenizer(source, "calibration"), calibration) if calibration else None
    quantize(int8, o.mode, inplace=True, alpha=o.alpha, calibration=batches,
             source="text" if batches else None, seed=o.seed)
    report = _report(o.mode, fp32, int8, source, as_batch(fp32, ids, mask), o.rounds)
    if task_before is not None:
        report["before"].update(_metric(task_before, records))
        report["after"].update(_metric(task_after, records))
    report["kernels"], report["ffn_routes"] = choices(), routes()
    if o.mode == "dynamic":  # accuracy rests on it
        report["activation_bits"] = quantised_bits(report["kernels"], report["ffn_routes"])
        smoothing = int8.config.quantization.get("smoothing")
        if smoothing:
            report["smoothing"] = {**smoothing, "calibration_texts": len(calibration or ())}
    # written beside out/model, then put in its place whole (compress/model_files.py); an earlier run's
    # report never stands beside this model
    (out / "quantize.json").unlink(missing_ok=True)
    replace_dir(out / "model", lambda staging: _write(source, int8, task_after, tokenizer, staging))
    report["after"]["bytes"] = model_bytes(out / "model")
    report["size_ratio"] = report["after"]["bytes"] / max(report["before"]["bytes"], 1)
    atomic_write_text(out / "quantize.json", json.dumps(report, indent=2) + "\n")
    return report
