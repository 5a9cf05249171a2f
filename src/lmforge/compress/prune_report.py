"""`lmforge prune`: structured pruning of a fine-tuned model, with what it cost and what it bought.

Methods: "ffn" (each layer's least important feed-forward units, compress/ffn.py) and "heads"
(iterative head pruning by importance, analysis/heads.py). Either shrinks the matrices; the
report gives size on disk, parameters, the task metric and the measured forward time before
and after, as a table and prune.json.
"""
from __future__ import annotations

import json
from pathlib import Path

from lmforge.analysis.head_report import forward_seconds
from lmforge.analysis.heads import masked_heads, metric, pruning_curve
from lmforge.analysis.pruning import prune_heads
from lmforge.compress.ffn import ffn_importance, prune_ffn
from lmforge.config import atomic_write_text
from lmforge.io import model_dir as resolve_dir
from lmforge.tasks.finetune import encode_split, fine_tuned_task, save_model

METHODS = ("ffn", "heads")


def _measure(task, records: list, examples: list, path: Path | None = None) -> dict:
    model = task.model
    out = {"parameters": model.num_parameters(), "seconds_b16": forward_seconds(model, examples, task, 16, 9),
           "metric": metric(task, records, examples, None)[1]}
    if path is not None:
        out["bytes"] = sum(f.stat().st_size for f in Path(path).glob("*.safetensors"))
    return out


def _prune(task, method: str, sparsity: float, importance_examples: list, score_data: tuple) -> dict:
    """Apply `method` at `sparsity`; returns what was removed."""
    if method == "ffn":
        return {"ffn_sizes": prune_ffn(task.model, ffn_importance(task, importance_examples), sparsity)}
    step = min(0.1, sparsity)
    levels, gates = pruning_curve(task, score_data, importance_examples, "importance", step=step,
                                  max_fraction=sparsity + 1e-9)
    removed = masked_heads(gates, task.model.config)
    prune_heads(task.model, removed)
    return {"pruned_heads": removed, "levels": levels}


def run_prune(model_dir, records: list, out, method: str, sparsity: float, kind: str | None = None,
              importance_records: list | None = None) -> dict:
    """Prune the fine-tuned model at `model_dir` by `method`, save it under out/model, report."""
    if method not in METHODS:
        raise ValueError(f"--method {method!r}: expected one of {', '.join(METHODS)}")
    if not 0 < sparsity < 1:
        raise ValueError(f"--sparsity {sparsity}: the share removed, in (0, 1)")
    out = Path(out)
    task = fine_tuned_task(model_dir, records, kind)
    examples = encode_split(task, records, "data")
    imp = encode_split(task, importance_records, "importance data") if importance_records else examples
    before = _measure(task, records, examples, resolve_dir(model_dir))
    removed = _prune(task, method, sparsity, imp, (records, examples))
    save_model(task, out / "model")
    after = _measure(task, records, examples, out / "model")
    report = {"method": method, "sparsity": sparsity, "before": before, "after": after,
              "speedup": before["seconds_b16"] / after["seconds_b16"], **removed}
    atomic_write_text(out / "prune.json", json.dumps(report, indent=2) + "\n")
    return report
