"""Fingerprints of what produced a bake-off's results, so a rerun with a changed plan reruns what changed.

A finished unit of a plan (an arm's pretraining at one seed; its fine-tuning on one task) is stored
with the sha256 of everything that made it: the arm (and the arms it continues), the seed, the
budget it pretrained for and the revision of the FLOP counting that turned it into steps, the corpus
and tokenizer settings, the pretraining and fine-tuning recipes, the task's definition and lmforge's
version. A rerun keeps a unit only when its fingerprint is the plan's; any other is run again (and its
old result dropped), which the run says in one line.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json

from lmforge import __version__
from lmforge.bakeoff.flops import COUNTING
from lmforge.bakeoff.plan import Arm, Plan


def digest(value) -> str:
    """sha256 (hex, 16 characters) of a JSON-able value, keys sorted."""
    text = json.dumps(value, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def tokenizer_key(plan: Plan) -> str:
    """The plan's tokenizer: trained on the plan's corpus with its settings."""
    return digest({"corpus": plan.corpus, "tokenizer": plan.tokenizer, "version": __version__})


def task_key(task: dict) -> str:
    """A downstream task's splits: its definition."""
    return digest({"task": task, "version": __version__})


def pretrain_key(plan: Plan, arm: Arm, seed: int) -> str:
    """An arm's pretrained model at `seed` (an arm without pretraining: the model it starts from)."""
    parts = {"arm": dataclasses.asdict(arm), "seed": seed, "tokenizer": tokenizer_key(plan),
             "version": __version__}
    if arm.pretrain:  # a baseline spends no budget: changing the budget leaves it as it is
        parts.update(budget=plan.budget, pretrain=plan.pretrain, corpus=arm.corpus or plan.corpus,
                     counting=COUNTING)  # the steps the budget buys
    if arm.continue_from is not None:
        parts["continues"] = pretrain_key(plan, plan.arm(arm.continue_from), seed)
    return digest(parts)


def schedule_key(plan: Plan, arm: Arm) -> str:
    """An arm's schedule (steps, FLOPs): its pretraining's fingerprint without the seed, which it does not
    depend on; the report shows a schedule.json entry only when it is the plan's."""
    return pretrain_key(plan, arm, None)


def result_key(plan: Plan, arm: Arm, seed: int, task: dict) -> str:
    """One (arm, seed, task) result: the pretrained model, the fine-tuning recipe and the task."""
    return digest({"pretrained": pretrain_key(plan, arm, seed), "finetune": plan.finetune,
                   "task": task_key(task), "version": __version__})


def current(plan: Plan, rows: list) -> tuple:
    """(rows of `plan` as it is, rows a changed plan left behind): a row with a fingerprint that is
    not the plan's is left behind; one without a fingerprint (written by hand) is kept."""
    tasks = {t["name"]: t for t in plan.tasks}
    arms = {a.name: a for a in plan.arms}
    kept, stale = [], []
    for row in rows:
        arm, task = arms.get(row.get("arm")), tasks.get(row.get("task"))
        fresh = "fingerprint" not in row or (
            arm is not None and task is not None and
            row["fingerprint"] == result_key(plan, arm, row["seed"], task))
        (kept if fresh else stale).append(row)
    return kept, stale
