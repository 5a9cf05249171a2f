"""`lmforge prune`: structured pruning of a fine-tuned model, with what it cost and what it bought.

Methods: "ffn" (each layer's least important feed-forward units, compress/ffn.py) and "heads"
(iterative head pruning by importance, compress/head_importance.py). Either shrinks the matrices; the
report gives size on disk, parameters, the task metric and the measured forward time before
and after, as a table and prune.json, and the share of units or heads removed as counted on the
pruned model beside the share asked (whole units and heads: rounding is said, and a share that
rounds to nothing is refused). An int8-quantised model is refused: its weights are int8 codes.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from torch import nn

from lmforge.compress.ffn import ffn_importance, prune_ffn, units_kept, widths
from lmforge.compress.head_importance import (CurveOptions, full_gates, masked_heads, pruning_curve,
                                              total_heads)
from lmforge.compress.head_pruning import attention_keys, prune_heads
from lmforge.compress.measure import given_data, measure_side_by_side
from lmforge.compress.model_files import carry_sentence_files, output_folder
from lmforge.compress.sparsity import PRUNING, refuse_int8, smallest_sparsity
from lmforge.config import ConfigError, atomic_write_text
from lmforge.config.options import OptionsError
from lmforge.io import CONFIG_FILE, read_meta
from lmforge.io import model_dir as resolve_dir
from lmforge.tasks.finetune import encode_split, fine_tuned_task, save_model
from lmforge.tasks.reference import saved_kind
from lmforge.utils.atomic import replace_dir
from lmforge.utils.ranks import one_process

METHODS = ("ffn", "heads")
PRUNE_WRITES = ("model", "prune.json")  # what a structured run writes under out (lmforge prune checks it)


def refuse_quantised(model, said: str = "model_dir") -> None:
    """An error where `model` (a loaded model, or a directory or name: its config.json, read before any weight
    loads) is int8-quantised: pruning needs the fp32 weights. A folder's is an OptionsError naming model_dir
    (run_prune's argument) as `said` says it: the command line's --model."""
    if isinstance(model, nn.Module):
        return refuse_int8(model)
    path = resolve_dir(model)
    if path is None or not (Path(path) / CONFIG_FILE).is_file():
        return None  # a preset name, or no model at all: the loader says so
    config = read_meta(Path(path)).get("config")
    quantization = config.get("quantization") if isinstance(config, dict) else None
    if quantization:
        mode = quantization.get("mode") if isinstance(quantization, dict) else quantization
        raise OptionsError(f"{said} {model}: the model is int8-quantised ({mode}): {PRUNING}", "model_dir")
    return None


def _heads_plan(cfg, sparsity: float) -> dict:
    """Whole heads, never a layer's last, at most `sparsity` of them, in levels of about a tenth of the
    heads (the iterative pruning of Michel et al. 2019) chosen to add up to that many where they can."""
    gates = full_gates(cfg)
    n = total_heads(gates)
    removable = sum(g.numel() - 1 for layer_gates in gates.values() for g in layer_gates)
    k = min(math.floor(sparsity * n + 1e-9), removable)
    tenth = max(1, round(min(0.1, sparsity) * n))
    per_level = next((d for d in range(min(tenth, k), (tenth + 1) // 2 - 1, -1) if d > 0 and k % d == 0),
                     max(1, min(tenth, k)))
    removed = k // per_level * per_level
    why = (f"each layer keeps a head, so at most {removable} can go" if removable < sparsity * n else
           f"whole heads, in levels of {per_level}")
    return {"unit": "heads", "total": n, "removed": removed, "removable": removable, "per_level": per_level,
            "why": why}


def _ffn_plan(model, sparsity: float) -> dict:
    """Whole FFN hidden units, each layer its own share (at least one kept)."""
    sizes = widths(model)
    total = sum(sizes.values())
    removed = sum(w - units_kept(w, sparsity) for w in sizes.values())
    per_layer = "/".join(str(w) for w in sorted(set(sizes.values())))
    return {"unit": "FFN units", "total": total, "removed": removed, "largest": max(sizes.values()),
            "why": f"whole units, each layer of {per_layer} rounding its own share"}


def plan(model, method: str, sparsity: float) -> dict:
    """What `method` at `sparsity` removes from `model`: {"unit", "total", "removed", "why"}; an
    OptionsError naming sparsity (and the smallest that removes something) where that is nothing, or
    method where heads cannot be cut."""
    if method == "heads":  # heads that cannot be cut (T5, GQA, ALBERT): before importance is estimated
        try:
            model.config.replace(pruned_heads={attention_keys(model.config)[0]: []})
        except ConfigError as err:
            raise OptionsError(f"method=heads: {err}", "method") from None
    found = _ffn_plan(model, sparsity) if method == "ffn" else _heads_plan(model.config, sparsity)
    if found["removed"] > 0:
        return found
    unit = found["unit"][:-1]
    if found.get("removable") == 0:
        raise OptionsError(f"method=heads: every layer has one head left, and a layer keeps its last: "
                           f"no {unit} can go", "method")
    planned = _ffn_plan if method == "ffn" else (lambda m, s: _heads_plan(m.config, s))
    smallest = smallest_sparsity(lambda s: planned(model, s)["removed"] > 0,
                                 found.get("largest", found["total"]))
    raise OptionsError(f"sparsity={sparsity} removes no {unit} ({found['total']} {found['unit']} in all; "
                       f"{found['why']}); the smallest sparsity that removes one is {smallest}", "sparsity")


def _count(model, method: str) -> int:
    """The model's FFN hidden units (ffn) or attention heads (heads), as they are now."""
    return sum(widths(model).values()) if method == "ffn" else total_heads(full_gates(model.config))


def _prune(task, method: str, found: dict, sparsity: float, importance: list, score_data: tuple) -> dict:
    """Apply `method` at `sparsity` as `found` (plan) planned it; returns what was removed."""
    if method == "ffn":
        return {"ffn_sizes": prune_ffn(task.model, ffn_importance(task, importance), sparsity)}
    n = found["total"]  # levels of per_level heads, up to the planned count
    curve = CurveOptions(step=found["per_level"] / n, max_fraction=(found["removed"] + 0.5) / n)
    levels, gates = pruning_curve(task, score_data, importance, curve)
    removed = masked_heads(gates, task.model.config)
    prune_heads(task.model, removed)
    return {"pruned_heads": removed, "levels": levels}


def _achieved(sparsity: float, found: dict, total: int, left: int) -> dict:
    """The share removed as counted on the pruned model, and a line where rounding made it differ."""
    achieved = (total - left) / total
    out = {"achieved_sparsity": achieved,
           "removed": {"unit": found["unit"], "removed": total - left, "of": total}}
    if abs(achieved - sparsity) > 1e-9:
        out["rounding"] = (f"--sparsity {sparsity} rounds to {total - left} of {total} {found['unit']} "
                           f"({achieved:.4f}): {found['why']}")
    return out


def _write(task, source, staging: Path) -> None:
    """The pruned task's model, tokenizer and task.json, and the source's sentence-transformers files."""
    save_model(task, staging)
    found = resolve_dir(source)
    if found is not None:
        carry_sentence_files(Path(found), staging)


def run_prune(model_dir, records: list, out, method: str, sparsity: float, kind: str | None = None,
              importance_records: list | None = None) -> dict:
    """Prune the fine-tuned model at `model_dir` by `method`, save it under out/model, and report both
    models as saved, measured side by side (compress/measure.py), and what was removed."""
    one_process("run_prune")
    if method not in METHODS:
        raise OptionsError(f"method {method!r}: expected one of {', '.join(METHODS)}", "method")
    if isinstance(sparsity, bool) or not isinstance(sparsity, (int, float)) or not 0 < sparsity < 1:
        raise OptionsError(f"sparsity {sparsity!r}: the share removed, in (0, 1)", "sparsity")
    out = output_folder(out, resolve_dir(model_dir), PRUNE_WRITES, "model_dir")  # before any work, as --out
    refuse_quantised(model_dir)
    kind = saved_kind(model_dir, kind)
    records = given_data(records, kind)  # before any work, as --data is read
    if importance_records is not None:  # [] would rank on records, unsaid
        importance_records = given_data(importance_records, kind, "importance_records")
    task = fine_tuned_task(model_dir, records, kind)
    refuse_quantised(task.model)
    found = plan(task.model, method, sparsity)
    examples = encode_split(task, records, "data")
    imp = encode_split(task, importance_records, "importance data") if importance_records else examples
    total = _count(task.model, method)
    removed = _prune(task, method, found, sparsity, imp, (records, examples))
    (out / "prune.json").unlink(missing_ok=True)  # an earlier run's report never stands beside this model
    replace_dir(out / "model", lambda staging: _write(task, model_dir, staging))  # whole, never mixed
    # both as saved, loaded alike and timed side by side (rounds alternate): load elsewhere hits both
    after = fine_tuned_task(out / "model", records, kind)
    measured = measure_side_by_side({"before": fine_tuned_task(model_dir, records, kind), "after": after},
                                    records, {"before": model_dir, "after": out / "model"})
    report = {"method": method, "sparsity": sparsity,
              **_achieved(sparsity, found, total, _count(after.model, method)),
              "metric_name": measured["after"]["metric_name"], **measured, **removed}
    atomic_write_text(out / "prune.json", json.dumps(report, indent=2) + "\n")
    return report
