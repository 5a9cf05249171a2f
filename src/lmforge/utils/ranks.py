"""One process or one of several under torchrun (WORLD_SIZE), read before or without a process group; the one
rule of the jobs that run in one process (train/distributed.py joins the group for those that do not)."""
from __future__ import annotations

import os

from lmforge.utils.errors import OptionsError


def several_ranks() -> bool:
    """Whether this process is one of a torchrun job of more than one (its environment's WORLD_SIZE), before
    or without a process group."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def one_process(job: str, error: type = OptionsError) -> None:
    """`error` (one line naming `job`) where this process is one of a torchrun job of several: the one rule,
    called before the job reads or writes anything, of every job that runs in one process (all but pretrain
    and finetune, whose Trainer joins the process group and whose rank 0 alone writes). An OptionsError's
    field is "WORLD_SIZE", the setting to change; the callers' own error classes (PlanError, UsageError) take
    the message alone."""
    if not several_ranks():
        return
    # several ranks would each run the whole job, each writing the same output
    message = (f"{job} runs in one process: run it without torchrun (this process is one of "
               f"WORLD_SIZE={os.environ['WORLD_SIZE']})")
    if issubclass(error, OptionsError):
        raise error(message, "WORLD_SIZE")
    raise error(message)
