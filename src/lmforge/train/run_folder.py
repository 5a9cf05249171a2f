"""Where a training run starts: its output folder, checked before any work (a model read, a corpus
tokenized) for what the run would find there, as Trainer.fit checks it again when the run begins."""
from __future__ import annotations

from pathlib import Path

from lmforge.train.checkpoint import check_resumable, checkpoints, training_folder
from lmforge.utils.atomic import UnsafePath


def check_start(out, resume: bool) -> None:
    """With resume, check_resumable (a checkpoint to continue); without, UnsafePath naming out where it holds
    a run's checkpoints already, among which a fresh run would write its own (a resume continues them)."""
    if resume:
        check_resumable(out)
    elif checkpoints(Path(out) / "checkpoints"):  # a killed first save's .tmp folder is no checkpoint
        raise UnsafePath(f"out {out} already holds a run's checkpoints: pass resume=True (--resume) to "
                         "continue it, or another folder", "out")


def run_folder(out, resume: bool, **inputs) -> Path:
    """training_folder(out, **inputs) (never over an input), checked for the run's start (check_start)."""
    out = training_folder(out, **inputs)
    check_start(out, resume)
    return out
