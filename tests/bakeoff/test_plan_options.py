"""A plan's run options are judged by the options objects that run them: a plan accepts and refuses what
TrainConfig, TaskConfig and RecipeOptions (so `lmforge pretrain` / `lmforge finetune`) accept and refuse."""
from __future__ import annotations

import copy
import dataclasses
import math
import re

import pytest

from lmforge.bakeoff import PlanError, check_plan
from lmforge.bakeoff.plan import BOUNDS, NOT_IN_PRETRAIN, check_seeds
from lmforge.config.options import base_type
from lmforge.tasks.base import option_owners
from lmforge.tasks.finetune import TaskConfig
from lmforge.tasks.formats import BUILTIN
from lmforge.train import TrainConfig
from lmforge.train.pretrain_options import RecipeOptions


def _bounded(cls, skip=()) -> list:
    """The scalar number fields of `cls` with a bound, but those in `skip`."""
    return [f.name for f in dataclasses.fields(cls) if f.name not in skip and not f.metadata.get("items")
            and base_type(f.type)[0] in ("int", "float")
            and (f.metadata.get("low") is not None or f.metadata.get("high") is not None)]


def _put(plan: dict, where: str, value) -> None:
    """`value` as the plan's key `where`, alone in its section (as the options object is built below)."""
    section, _, key = where.partition(".")
    if section == "arms[0]" and key.startswith("train."):
        plan["pretrain"], plan["arms"][0]["train"] = {}, {key[len("train."):]: value}
    elif section == "arms[0]":
        plan["arms"][0][key] = value
    elif section == "seeds[0]":
        plan["seeds"] = [value]
    elif section == "corpus":
        plan["corpus"][key] = value
    else:
        plan[section] = {key: value}


# a fine-tuning option of a kind of task is read beside a task of that kind (a built-in one); one of a kind no
# bake-off task is (seq2seq's num_beams, rerank's loss) no plan reads: plan_reads refuses it at any value
OWNERS, BUILT_IN = option_owners(), {kind: name for name, kind in BUILTIN.items()}
READER = {key: next((BUILT_IN[k] for k in kinds if k in BUILT_IN), None) for key, kinds in OWNERS.items()}


def _task_reading(key: str) -> list:
    """The plan task that reads the fine-tuning option `key` where only a kind of task does, else none."""
    return [{"name": "reader", "source": "builtin", "task": READER[key], "n": 40}] if READER.get(key) else []


SHARED = ([(f"pretrain.{k}", TrainConfig, k) for k in _bounded(TrainConfig, NOT_IN_PRETRAIN)]
          + [(f"arms[0].train.{k}", TrainConfig, k) for k in _bounded(TrainConfig, NOT_IN_PRETRAIN)]
          + [(f"finetune.{k}", TrainConfig, k) for k in _bounded(TrainConfig, ("seed",))]
          + [(f"finetune.{k}", TaskConfig, k) for k in _bounded(TaskConfig) if k not in OWNERS or READER[k]]
          + [("pretrain.max_len", RecipeOptions, "max_len"),
             ("arms[0].train.max_len", RecipeOptions, "max_len"),
             ("arms[0].duplication", RecipeOptions, "duplication"),
             ("seeds[0]", TrainConfig, "seed"), ("corpus.seed", TrainConfig, "seed")])


def _either_side(meta: dict, integer: bool) -> list:
    """Each bound of a field, and the nearest values on either side of it."""
    values = []
    for bound in (meta.get("low"), meta.get("high")):
        if bound is None:
            continue
        if integer:
            values += [bound - 1, bound, bound + 1]
        else:
            values += [math.nextafter(bound, -math.inf), float(bound), math.nextafter(bound, math.inf)]
    return values


def _accepts(make, value) -> bool:
    try:
        make(value)
        return True
    except (ValueError, TypeError):
        return False


@pytest.mark.parametrize("where, cls, name", SHARED, ids=[w for w, _, _ in SHARED])
def test_a_plan_accepts_and_refuses_what_the_options_object_does_on_both_sides_of_each_bound(
        tiny_plan, where, cls, name):
    declared = next(f for f in dataclasses.fields(cls) if f.name == name)
    build = cls.from_dict if hasattr(cls, "from_dict") else lambda data: cls(**data)
    values = _either_side(declared.metadata, base_type(declared.type)[0] == "int")
    assert values, where
    verdicts = set()
    for value in values:
        plan = copy.deepcopy(tiny_plan)
        _put(plan, where, value)
        plan["tasks"] += _task_reading(name) if where.startswith("finetune.") else []
        runs = _accepts(lambda v: build({name: v}), value)
        try:
            check_plan(plan, "my.yaml")
            planned, message = True, ""
        except PlanError as err:
            planned, message = False, str(err)
        assert planned == runs, (where, value, message)
        assert planned or ("\n" not in message and message.startswith(f"my.yaml: {where}")), message
        verdicts.add(runs)
    assert verdicts == {True, False}, where  # each bound is met from both sides


@pytest.mark.parametrize("where, value, accepted", [
    ("finetune.epochs", 5000, True), ("finetune.epochs", 10_000, True), ("finetune.epochs", 10_001, False),
    ("finetune.epochs", 0, False),
    ("pretrain.accumulation", 4096, True), ("pretrain.accumulation", 4097, False),
    ("seeds[0]", 2 ** 63 - 1, True), ("seeds[0]", 2 ** 63, False), ("seeds[0]", -1, False),
])
def test_the_probes_values_are_judged_as_the_commands_judge_them(tiny_plan, where, value, accepted):
    """epochs 5000, accumulation 4096 and seeds past 2^31 run as the commands run them; epochs 0 does not."""
    _put(tiny_plan, where, value)
    if accepted:
        check_plan(tiny_plan)
        return
    with pytest.raises(PlanError, match=rf"^my\.yaml: {re.escape(where)} ") as err:
        check_plan(tiny_plan, "my.yaml")
    assert "must be" in str(err.value)  # the options object's wording


def test_epochs_zero_is_refused_in_the_options_words_naming_the_plans_key(tiny_plan):
    tiny_plan["finetune"] = {"epochs": 0}
    with pytest.raises(PlanError) as err:
        check_plan(tiny_plan, "my.yaml")
    with pytest.raises(ValueError) as options:
        TrainConfig.from_dict({"epochs": 0})
    assert str(err.value) == f"my.yaml: finetune.{options.value}"


def test_an_unknown_fine_tuning_option_lists_both_objects_keys(tiny_plan):
    tiny_plan["finetune"] = {"max_len": 64, "lr": 1e-4, "learning_rate": 1e-4}  # TaskConfig's, TrainConfig's
    with pytest.raises(PlanError, match=r"^my\.yaml: finetune: unknown option learning_rate; ") as e:
        check_plan(tiny_plan, "my.yaml")
    assert "did you mean lr?" in str(e.value) and "(all: lmforge options finetune)" in str(e.value)
    tiny_plan["finetune"] = {"max_lenn": 64}  # TaskConfig's keys too, not only TrainConfig's
    with pytest.raises(PlanError) as e:
        check_plan(tiny_plan, "my.yaml")
    assert str(e.value).startswith("my.yaml: finetune: unknown option max_lenn; did you mean max_len")


@pytest.mark.parametrize("key", NOT_IN_PRETRAIN)
def test_what_the_plan_sets_is_refused_in_a_pretraining_recipe(tiny_plan, key):
    """The budget sets a pretraining run's steps (epochs would contradict them), the seeds its seed."""
    tiny_plan["pretrain"][key] = 1
    with pytest.raises(PlanError, match=rf"pretrain\.{key}: is set by the plan"):
        check_plan(tiny_plan, "my.yaml")


@pytest.mark.parametrize("where", ["pretrain", "arms"])
def test_a_compiled_pretraining_run_is_refused(tiny_plan, where):
    """A compiled model is never unpadded, so it would run its padding over the budget, which charges an
    arm's real tokens alone (bakeoff/flops.py): its arm would get more compute than the others, unsaid."""
    recipe = tiny_plan["pretrain"] if where == "pretrain" else tiny_plan["arms"][0].setdefault("train", {})
    recipe["compile"] = True
    with pytest.raises(PlanError, match=r"\.compile: a compiled run computes its padding"):
        check_plan(tiny_plan, "my.yaml")
    recipe["compile"] = False
    check_plan(tiny_plan, "my.yaml")


def test_the_steps_a_budget_buys_are_bounded_as_trainconfig_bounds_steps():
    steps = next(f for f in dataclasses.fields(TrainConfig) if f.name == "steps").metadata
    assert BOUNDS["steps"] == (steps["low"], steps["high"])


def test_the_command_lines_seeds_are_a_runs_seeds():
    """`lmforge bakeoff --seeds` goes through check_seeds: the range of TrainConfig's seed."""
    assert check_seeds([0, 2 ** 63 - 1], "--seeds") == (0, 2 ** 63 - 1)
    with pytest.raises(PlanError, match=r"^--seeds\[1\] must be an integer"):
        check_seeds([0, 2 ** 63], "--seeds")


def test_the_shared_tokenizer_is_judged_by_tokenizer_options(tiny_plan):
    """A byte-level vocabulary needs its 256 bytes and the specials: refused by the plan, not after the
    corpus is built."""
    tiny_plan["tokenizer"] = {"family": "roberta", "vocab_size": 200}
    with pytest.raises(PlanError, match=r"^my\.yaml: tokenizer\.vocab_size must be an integer >= 261 "):
        check_plan(tiny_plan, "my.yaml")
    tiny_plan["tokenizer"] = {"family": "roberta", "vocab_size": 261}
    check_plan(tiny_plan, "my.yaml")
