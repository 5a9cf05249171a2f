"""What a compression cost and bought, measured the same way for every method: parameters, size
on disk, the task metric and forward time, with the models timed side by side in one process
(rounds alternate A B A B ... on the same batch, so load from elsewhere hits both alike)."""
from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from lmforge.config.options import OptionsError
from lmforge.fast.optimize import optimize
from lmforge.io import model_dir as resolve_dir
from lmforge.tasks.fields import given_records
from lmforge.tasks.finetune import encode_split
from lmforge.utils.timing import alternating


def model_bytes(path) -> int:
    """Bytes of the weight files a model directory is loaded from: its safetensors files, or (a Hugging
    Face directory without them) its pytorch_model*.bin ones, which the loader reads then."""
    folder = Path(resolve_dir(path) or path)
    # as convert/hf's order of preference: a .bin beside safetensors is never read, so never counted
    files = sorted(folder.glob("*.safetensors")) or sorted(folder.glob("pytorch_model*.bin"))
    return sum(f.stat().st_size for f in files)


def given_data(records, kind: str | None, name: str = "records") -> list:
    """Labelled `records` a compression job scores (or ranks importance) on, checked before any work as a
    --data file is read: an OptionsError naming `name` where they are no list of records or none at all
    (a job trained, pruned or wrote its model before a TypeError); each record's fields checked as a file's
    are (tasks.fields.given_records) where the task `kind` is known. A record is named as the caller gave
    it: a file's (--data) by its file and line, a Python list's as `name`:n (its own line, else its number
    from 1, as fine-tuning's train:n), and a later error (when encoded) names the argument `name`."""
    if records is None or isinstance(records, (str, bytes, dict)) or not isinstance(records, Iterable):
        raise OptionsError(f"{name} must be a list of labelled records (dicts of fields), got "
                           f"{type(records).__name__}", name)
    records = given_records(records, kind, name)
    if not records:
        raise OptionsError(f"{name} is empty: give the labelled records to score on", name)
    return records


def side_by_side(tasks: dict, batches: dict, rounds: int = 9) -> dict:
    """name -> median seconds of one inference forward (task.predict) of its batch, alternating; each
    model optimized first, as the jobs that serve it run it (fast/optimize.py)."""
    for task in tasks.values():
        optimize(task.eval())
    calls = {name: (lambda task=task: task.predict(batches[id(task)])) for name, task in tasks.items()}
    return alternating(calls, rounds)


def forward_title(rows) -> str:
    """The forward-time column's title: the batch the rows were timed on (fewer than 16 where the data
    held fewer records)."""
    sizes = sorted({r.get("timed_batch", 16) for r in rows})
    return f"forward s (batch {'/'.join(str(n) for n in sizes)})"


def measure_side_by_side(tasks: dict, records: list, paths: dict, batch_size: int = 16,
                         rounds: int = 9) -> dict:
    """name -> {parameters, bytes, metric name and value, seconds_b16, timed_batch} for each task given
    (None: left out), and "speedup": the first's time over the last's. The batch timed is the first
    `batch_size` records: timed_batch says how many it held (fewer where fewer records were given)."""
    tasks = {name: task for name, task in tasks.items() if task is not None}
    out: dict = {}
    batches = {}
    for name, task in tasks.items():
        examples = encode_split(task, records, "data")
        _, metrics = task.evaluate(records, 64, examples)
        primary = next(iter(metrics))
        out[name] = {"parameters": task.model.num_parameters(), "bytes": model_bytes(paths[name]),
                     "metric_name": primary, "metric": float(metrics[primary]),
                     "timed_batch": len(examples[:batch_size])}
        batches[id(task)] = {k: v.to(task.device) for k, v in task.collate(examples[:batch_size]).items()}
    seconds = side_by_side(tasks, batches, rounds)
    for name, s in seconds.items():
        out[name]["seconds_b16"] = s
    names = list(tasks)
    out["speedup"] = seconds[names[0]] / seconds[names[-1]]
    return out
