"""Where a job's output folder keeps its model, so every loader reads a folder a job wrote."""
from __future__ import annotations

from pathlib import Path

# a job's --out folder holds its model in one of these (quantize, prune: model/; pretrain, finetune,
# distill: final/): naming the folder itself loads it, so every loader reads what a job wrote
JOB_MODEL_FOLDERS = ("model", "final")


def inside_job_folder(path: Path) -> Path:
    """`path`, or the model folder inside a job's output folder that has no model of its own."""
    if (path / "config.json").is_file():
        return path
    return next((path / sub for sub in JOB_MODEL_FOLDERS if (path / sub / "config.json").is_file()), path)
