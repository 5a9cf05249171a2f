"""`lmforge quantize`'s work: quantise a saved model, save it, and measure what it cost and bought.

Size on disk (safetensors bytes), weights (int8 ones counted), forward time of the fp32 and the
int8 model side by side in one process (rounds alternate A B A B on the same batch, so load from
elsewhere hits both alike) and, for a fine-tuned model given labelled data, the task metric.
The report is a dict, written as quantize.json.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from lmforge.compress.measure import alternating
from lmforge.compress.quantize import int8_layers, int8_share, parameter_count, quantize
from lmforge.compress.smooth import ALPHA, random_tokens, text_batches
from lmforge.config import atomic_write_text
from lmforge.fast.int8 import choices, eight_bit_activations
from lmforge.io import find_model_dir, load
from lmforge.tasks.finetune import TASK_FILE, encode_split, fine_tuned_task, save_model
from lmforge.tokenizer import load_tokenizer


def _sizes(model, path: Path | None) -> dict:
    out = {"parameters": parameter_count(model), "int8_layers": int8_layers(model),
           "int8_share": round(int8_share(model), 4)}
    if path is not None:
        out["bytes"] = sum(f.stat().st_size for f in path.glob("*.safetensors"))
    return out


def _metric(task, records: list) -> dict:
    examples = encode_split(task, records, "data")
    predictions = task.decode(records, examples, task.outputs(examples, 64))
    name, value = next(iter(task.score(records, predictions).items()))
    return {"metric_name": name, "metric": float(value)}


SENTENCE_FILES = ("modules.json", "sentence_bert_config.json", "config_sentence_transformers.json")


def carry_sentence_files(source: Path, dest: Path) -> None:
    """Copy a sentence-transformers directory's own files (modules, pooling, max_seq_length), so the
    quantised model embeds as the original does."""
    for name in SENTENCE_FILES:
        if (source / name).is_file():
            shutil.copy2(source / name, dest / name)
    for folder in source.glob("[0-9]_*"):
        if folder.is_dir() and not (dest / folder.name).exists():
            shutil.copytree(folder, dest / folder.name)


def _tokenizer(source: Path, option: str):
    """The model's tokenizer, or a ValueError naming the option that needs it."""
    try:
        return load_tokenizer(source)
    except (OSError, ValueError) as err:
        raise ValueError(f"{option} needs the model's tokenizer: {err}") from None


def _models(source: Path, records, kind):
    """(fp32 task or None, fp32 model, int8-to-be task or None, its model): tasks where the model is
    fine-tuned and data was given."""
    if records is not None and ((source / TASK_FILE).is_file() or kind):
        # on the CPU, where the int8 kernels are (on a GPU the int8 layers would run dequantised)
        before, after = (fine_tuned_task(source, records, kind, device="cpu").eval() for _ in range(2))
        return before, before.model, after, after.model  # timed in eval mode: no dropout
    return None, load(source).eval(), None, load(source).eval()


def run_quantize(model, out, mode: str = "dynamic", records: list | None = None, kind: str | None = None,
                 batch_size: int = 8, seq_len: int = 128, rounds: int = 5, alpha: float | None = ALPHA,
                 calibration: list | None = None) -> dict:
    """Quantise the model at `model` (a directory or installed model), save it under out/model, and
    report sizes, speed side by side and (with `records`) the task metric before and after;
    calibration: texts to smooth from (None: random tokens), alpha None: no smoothing."""
    source, out = find_model_dir(model), Path(out)
    task_before, fp32, task_after, int8 = _models(source, records, kind)
    batches = text_batches(fp32, _tokenizer(source, "--calibration"), calibration) if calibration else None
    quantize(int8, mode, inplace=True, alpha=alpha, calibration=batches, source="text" if batches else None)
    if task_after is not None:
        save_model(task_after, out / "model")
    else:
        int8.save(out / "model")
        try:
            load_tokenizer(source).save(out / "model")
        except (OSError, ValueError):
            pass  # a model without a tokenizer (random ids only): nothing to carry over
    carry_sentence_files(source, out / "model")
    ids, mask = random_tokens(fp32, batch_size, seq_len)
    seconds = alternating({"before": lambda: fp32(ids, mask, run_heads=False),
                            "after": lambda: int8(ids, mask, run_heads=False)}, rounds)
    report = {"mode": mode, "batch": [int(ids.shape[0]), int(ids.shape[1])], "threads": torch.get_num_threads(),
              "before": {**_sizes(fp32, source), "seconds": seconds["before"]},
              "after": {**_sizes(int8, out / "model"), "seconds": seconds["after"]}}
    if task_before is not None:
        report["before"].update(_metric(task_before, records))
        report["after"].update(_metric(task_after, records))
    report["speedup"] = seconds["before"] / seconds["after"]
    report["size_ratio"] = report["after"]["bytes"] / max(report["before"]["bytes"], 1)
    report["kernels"] = choices()
    if mode == "dynamic":  # 8 under VNNI, else 7 (fast/int8.py): accuracy rests on it
        report["activation_bits"] = 8 if eight_bit_activations() else 7
        smoothing = int8.config.quantization.get("smoothing")
        if smoothing:
            report["smoothing"] = {**smoothing, "calibration_texts": len(calibration or ())}
    atomic_write_text(out / "quantize.json", json.dumps(report, indent=2) + "\n")
    return report
