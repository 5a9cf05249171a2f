"""A bake-off plan: arms compared at one FLOP budget, on one corpus, one tokenizer, one recipe.

A plan is a YAML or JSON mapping:

    name: electra
    budget: 2.0e13            # training FLOPs every arm spends (bakeoff/flops.py counts them)
    corpus: {source: gcide, documents: 3000}
    tokenizer: {family: bert, vocab_size: 2000}
    pretrain: {max_len: 64, batch_size: 16, lr: 5.0e-4}   # TrainConfig options shared by every arm
    finetune: {epochs: 2, batch_size: 16, lr: 1.0e-4, max_len: 64}  # TrainConfig + TaskConfig options
    tasks: [{name: pos, source: gcide-pos, n_per_label: 150}, {name: sentiment, source: builtin}]
    seeds: [0, 1, 2]
    arms:
      - {name: mlm, objective: mlm, preset: electra-small, overrides: {n_layers: 2}}
      - {name: electra, objective: rtd, preset: electra-small, options: {ratio: 0.5}}
    claims: [{better: electra, worse: mlm, task: pos}]

An arm may also set `examples` (fields of the objective's ExampleFormat: kind, pairs,
cross_documents), `duplication` (static masking), `corpus` (its own), `continue_from` (another
arm's pretrained model of the same seed) and `train` (TrainConfig options of its own). Every
error is one line naming the field, e.g. "plan.yaml: arms[1].objective: unknown objective 'x'". A value
the plan hands to a run (training options, max_len, duplication, seeds) is checked by the options object
that runs it (TrainConfig, TaskConfig, RecipeOptions), so a plan accepts what `lmforge pretrain` and
`lmforge finetune` accept, in their words; the plan's own sizes (documents, budget, counts of seeds,
arms and tasks, ...) are bounded both ways here (BOUNDS), and the error names the bound.
"""
from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field

import yaml

from lmforge.bakeoff.shipped import plan_file
from lmforge.bakeoff.plan_reads import (check_arm_counted, check_arm_reads, check_corpus_files,
                                        check_finetune_reads, check_task_reads)
from lmforge.config.model import MAX_VOCAB
from lmforge.config.names import known_names, listed_at, unknown_message
from lmforge.config.options import OptionsError, check_value
from lmforge.objectives.registry import TOKENIZER_KINDS
from lmforge.tasks.formats import BUILTIN_SIZE
from lmforge.tokenizer.chars import WORD_TOKENS
from lmforge.tokenizer.train import TokenizerOptions
from lmforge.train.config import MAX_STEPS
from lmforge.utils import jsontext
from lmforge.utils.yamltext import load_yaml
from lmforge.utils.errors import shown

CORPUS_SOURCES = ("gcide", "foldoc", "jargon", "builtin", "files")
TASK_SOURCES = ("gcide-pos", "foldoc-topic", "builtin")
EXAMPLE_FIELDS = ("kind", "pairs", "cross_documents")
TOP_KEYS = {"name", "budget", "corpus", "tokenizer", "pretrain", "finetune", "tasks", "seeds", "arms",
            "claims", "description"}
ARM_KEYS = {"name", "objective", "preset", "overrides", "options", "examples", "duplication", "corpus",
            "continue_from", "model", "pretrain", "train", "description"}
SOURCES = ("preset", "continue_from", "model")  # where an arm's model comes from: exactly one
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,99}$")  # arm and task names become directory names
# the plan's own sizes, bounded both ways (a dry run of documents: 1e9 would never end); name -> (lowest,
# highest). What a run takes (training options, max_len, duplication, seeds) is not here: the options
# object that runs it checks it (_option, _built), so a plan and the commands accept alike
BOUNDS = {"documents": (1, 10 ** 6),  # the corpus is built here (plan_corpus.corpus_files), held in memory
          "n_per_label": (2, 10 ** 5), "n": BUILTIN_SIZE,  # a task's records, built here (runner.task_splits)
          "vocab_size": (len(WORD_TOKENS) + 1, MAX_VOCAB),  # words' least; the other kinds': TokenizerOptions
          "seeds": (1, 100), "arms": (1, 64), "tasks": (1, 64),  # every arm x seed x task is a run
          "budget": (1.0, 1e21),  # FLOPs per arm
          "steps": (1, MAX_STEPS)}  # the steps a budget buys (runner.schedules) are TrainConfig's steps
NOT_IN_PRETRAIN = ("steps", "epochs", "seed")  # the budget sets a pretraining run's steps, the seeds its seed


class PlanError(ValueError):
    """A plan that cannot run: the message names the file and the field."""


@dataclass(frozen=True)
class Arm:
    """One pretraining recipe of the comparison."""

    name: str
    objective: str
    preset: str | None = None
    overrides: dict = field(default_factory=dict)
    options: dict = field(default_factory=dict)
    examples: dict = field(default_factory=dict)
    duplication: int = 0
    corpus: dict | None = None
    continue_from: str | None = None
    model: str | None = None  # a checkpoint (directory or installed model) pretrained further
    # False: fine-tune the start as it is (a baseline; a preset: its seeded random init)
    pretrain: bool = True
    train: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Claim:
    """A published claim: arm `better` scores above arm `worse` on `task` (its primary metric)."""

    better: str
    worse: str
    task: str
    source: str = ""


@dataclass(frozen=True)
class Plan:
    """Arms, one FLOP budget, one corpus, tokenizer, fine-tuning recipe, tasks and seeds."""

    name: str
    budget: float
    corpus: dict
    tokenizer: dict
    pretrain: dict
    finetune: dict
    tasks: tuple
    seeds: tuple
    arms: tuple
    claims: tuple = ()
    source: str = "plan"

    def arm(self, name: str) -> Arm:
        """The arm called `name`."""
        return next(a for a in self.arms if a.name == name)


def _fail(where: str, message: str):
    raise PlanError(f"{where}: {message}")


def _option(cls, name: str, value, where: str):
    """`value` as field `name` of the options class `cls` takes it (type, bounds both ways, wording);
    PlanError naming `where` otherwise."""
    declared = next(f for f in dataclasses.fields(cls) if f.name == name)
    try:
        check_value(where, declared.type, declared.metadata, value)
    except OptionsError as err:
        raise PlanError(str(err).splitlines()[0]) from None
    return value


def _built(make, options: dict, where: str):
    """make(options): an options object built as the run builds it; its refusal as a PlanError naming
    the plan's key (`where`.field)."""
    try:
        return make(options)
    except OptionsError as err:
        message = str(err).splitlines()[0]
        if err.field and re.match(rf"{re.escape(err.field)}[ \[]", message):  # "epochs must be ..."
            raise PlanError(f"{where}.{message}") from None
        _fail(f"{where}.{err.field}" if err.field else where, message)
    except (ValueError, TypeError) as err:
        _fail(where, str(err).splitlines()[0])


def _mapping(value, where: str, keys: set | None = None) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        _fail(where, f"must be a mapping, got {type(value).__name__}")
    unknown = set(value) - keys if keys is not None else set()
    if unknown:
        _fail(where, unknown_message(unknown, keys, "field", "help(lmforge.bakeoff.plan)"))
    return dict(value)


def bounded(value, where: str, bound: str, integer: bool = True):
    """`value`, a finite number within BOUNDS[bound] (an integer if `integer`); PlanError naming `where`
    and the bound otherwise."""
    low, high = BOUNDS[bound]
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not number or (integer and not isinstance(value, int)) or not math.isfinite(value) or \
            not low <= value <= high:
        kind = "an integer" if integer else "a finite number"
        _fail(where, f"must be {kind} in [{low}, {high}] (the bound on {bound}), got {value!r}")
    return value


def _name(value, where: str) -> str:
    if not isinstance(value, str) or not _NAME.match(value):
        _fail(where, f"must be a name of at most 100 letters, digits, _ . + - (got {shown(value, 100)})")
    return value


def check_corpus(corpus, where: str) -> dict:
    """A corpus mapping {source, documents, files}: checked, with its defaults."""
    corpus = _mapping(corpus, where, {"source", "documents", "files", "seed"})
    source = corpus.get("source", "gcide")
    if source not in CORPUS_SOURCES:
        _fail(f"{where}.source", f"{source!r} is not one of {', '.join(CORPUS_SOURCES)}")
    check_corpus_files(corpus, where, _fail)
    documents = bounded(corpus.get("documents", 2000), f"{where}.documents", "documents")
    if "seed" in corpus:  # drawn from as a run's seed is: the same range (TrainConfig's)
        from lmforge.train import TrainConfig

        _option(TrainConfig, "seed", corpus["seed"], f"{where}.seed")
    return {**corpus, "source": source, "documents": documents}


def _task(value, where: str) -> dict:
    task = _mapping(value, where, {"name", "source", "n_per_label", "n", "task"})
    _name(task.get("name"), f"{where}.name")
    if task.get("source") not in TASK_SOURCES:
        _fail(f"{where}.source", f"{task.get('source')!r} is not one of {', '.join(TASK_SOURCES)}")
    for key in ("n_per_label", "n"):
        if key in task:
            bounded(task[key], f"{where}.{key}", key)
    return check_task_reads(task, where, _fail)


def _arm(value, where: str) -> Arm:
    arm = _mapping(value, where, ARM_KEYS)
    for key in ("name", "objective"):
        if key not in arm:
            _fail(f"{where}.{key}", "missing")
    arm.pop("description", None)
    for key in ("overrides", "options", "examples", "train"):
        known = set(EXAMPLE_FIELDS) if key == "examples" else None
        arm[key] = _mapping(arm.get(key), f"{where}.{key}", known)
    if arm.get("corpus") is not None:
        arm["corpus"] = check_corpus(arm["corpus"], f"{where}.corpus")
    from lmforge.train.pretrain_options import RecipeOptions  # pretrain() builds it from the duplication

    _option(RecipeOptions, "duplication", arm.get("duplication", 0), f"{where}.duplication")
    if sum(arm.get(key) is not None for key in SOURCES) != 1:
        _fail(f"{where}.preset",
              "give exactly one of preset, continue_from (another arm) or model (a checkpoint)")
    if arm.get("model") is not None and not (isinstance(arm["model"], str) and arm["model"].strip()):
        _fail(f"{where}.model", f"must be a checkpoint's folder or an installed model's name, got "
                                f"{shown(arm['model'], 100)}")
    if arm.get("pretrain", True) not in (True, False):
        _fail(f"{where}.pretrain", f"must be true or false, got {arm['pretrain']!r}")
    if arm.get("model") is not None and arm["overrides"]:
        _fail(f"{where}.overrides", "a checkpoint (model) is pretrained further as it is: no overrides")
    return Arm(**{**arm, "name": _name(arm["name"], f"{where}.name")})


def _check_arm_objective(arm: Arm, where: str) -> None:
    """The objective exists, fits the preset, and takes the example fields given."""
    from lmforge import objectives
    from lmforge.presets import get_config

    if not isinstance(arm.objective, str):  # a list: "unhashable type", said of the preset
        _fail(f"{where}.objective", f"must be an objective's name, got {arm.objective!r}")
    named = f"{where}.preset"
    try:
        spec = objectives.get(arm.objective)
        if arm.preset is not None:
            get_config(arm.preset)
            named = f"{where}.overrides"  # the preset is known: a refusal now is of an override
            spec.check(get_config(arm.preset, **arm.overrides), arm.preset)
    except (ValueError, TypeError, KeyError) as err:
        _fail(f"{where}.objective" if "objective" in str(err) else named, str(err).splitlines()[0])
    if spec.teacher:
        _fail(f"{where}.objective", f"{spec.name!r} needs a teacher: not a bake-off arm")
    check_arm_reads(arm, spec, where, _fail)
    check_arm_counted(arm, spec, where, _fail)


def _claims(values, arms: dict, tasks: set, where: str) -> tuple:
    if not isinstance(values or [], list):
        _fail(where, "must be a list")
    out = []
    for i, value in enumerate(values or []):
        claim = _mapping(value, f"{where}[{i}]", {"better", "worse", "task", "source"})
        for key in ("better", "worse"):
            if not isinstance(claim.get(key), str) or claim[key] not in arms:  # a list: unhashable
                _fail(f"{where}[{i}].{key}", f"{claim.get(key)!r} is not an arm of the plan")
        if claim["better"] == claim["worse"]:
            _fail(f"{where}[{i}].worse", f"compares arm {claim['worse']!r} with itself")
        if not isinstance(claim.get("task"), str) or claim["task"] not in tasks:
            _fail(f"{where}[{i}].task", f"{claim.get('task')!r} is not a task of the plan")
        out.append(Claim(**claim))
    return tuple(out)


def check_seeds(value, where: str) -> tuple:
    """A non-empty list of distinct seeds, each one TrainConfig takes, as a tuple; PlanError naming `where`
    otherwise."""
    from lmforge.train import TrainConfig  # each seed is a run's TrainConfig seed

    seeds = value if value is not None else [0]
    if not isinstance(seeds, list) or not seeds:
        _fail(where, f"must be a non-empty list of integers >= 0, got {value!r}")
    bounded(len(seeds), where, "seeds")
    for i, seed in enumerate(seeds):
        _option(TrainConfig, "seed", seed, f"{where}[{i}]")
    if len(set(seeds)) != len(seeds):
        _fail(where, "repeats a seed")
    return tuple(seeds)


def _arms(values, where: str) -> tuple:
    if not isinstance(values, list) or not values:
        _fail(where, "must be a non-empty list of arms")
    bounded(len(values), where, "arms")
    arms = tuple(_arm(v, f"{where}[{i}]") for i, v in enumerate(values))
    names = [a.name for a in arms]
    for i, arm in enumerate(arms):
        if arm.name in names[:i]:
            _fail(f"{where}[{i}].name", f"{arm.name!r} names two arms")
        if arm.continue_from is not None and arm.continue_from not in names[:i]:
            _fail(f"{where}[{i}].continue_from", f"{arm.continue_from!r} is not an earlier arm")
        _check_arm_objective(arm, f"{where}[{i}]")
    return arms


def split_finetune(options: dict) -> tuple:
    """The fine-tuning recipe's options -> (TrainConfig dict, TaskConfig dict)."""
    from lmforge.tasks.finetune import TaskConfig

    task_keys = {f.name for f in dataclasses.fields(TaskConfig)}
    return ({k: v for k, v in options.items() if k not in task_keys},
            {k: v for k, v in options.items() if k in task_keys})


def _check_recipes(pretrain: dict, finetune: dict, arms: tuple, source: str) -> None:
    """Every training option as the runs take it: the pretraining options (the plan's, then each arm's) as
    TrainConfig and RecipeOptions (max_len) take them, the fine-tuning ones as TrainConfig and TaskConfig."""
    from lmforge.tasks.finetune import TaskConfig
    from lmforge.train import TrainConfig
    from lmforge.train.pretrain_options import RecipeOptions

    recipes = [("pretrain", pretrain)] + [(f"arms[{i}].train", a.train) for i, a in enumerate(arms)]
    for where, options in recipes:
        where = f"{source}: {where}"
        for key in NOT_IN_PRETRAIN:
            if key in options:
                _fail(f"{where}.{key}", "is set by the plan (budget, seeds), not here")
        if options.get("compile"):  # a compiled model is never unpadded (fast/execution.py)
            _fail(f"{where}.compile", "a compiled run computes its padding, which the budget's count (real "
                  "tokens, bakeoff/flops.py) does not charge: bake-off arms train eagerly")
        if "max_len" in options:
            _option(RecipeOptions, "max_len", options["max_len"], f"{where}.max_len")
        # an arm's run takes the plan's options, then its own (runner.pretrain_options)
        merged = {k: v for k, v in {**pretrain, **options}.items() if k != "max_len"}
        _built(TrainConfig.from_dict, merged, where)
    if "seed" in finetune:
        _fail(f"{source}: finetune.seed", "is set by the plan (seeds), not here")
    known = known_names((TaskConfig, TrainConfig), without={"seed"})
    unknown = sorted(set(finetune) - known)  # said here: TrainConfig alone would list only its own keys
    if unknown:
        _fail(f"{source}: finetune", unknown_message(unknown, known, listed=listed_at(TaskConfig)))
    train, task = split_finetune(finetune)
    _built(TrainConfig.from_dict, train, f"{source}: finetune")
    _built(TaskConfig.from_dict, task, f"{source}: finetune")


def _tasks(values, where: str) -> tuple:
    """The downstream tasks, checked, each name once (a task's name is its directory and report column)."""
    if not isinstance(values, list) or not values:
        _fail(where, "must be a non-empty list of downstream tasks")
    bounded(len(values), where, "tasks")
    tasks = tuple(_task(t, f"{where}[{i}]") for i, t in enumerate(values))
    names = [t["name"] for t in tasks]
    for i, name in enumerate(names):
        if name in names[:i]:
            _fail(f"{where}[{i}].name", f"{name!r} names two tasks")
    return tasks


def check_plan(data, source: str = "plan") -> Plan:
    """A plan mapping -> Plan; PlanError (one line naming `source` and the field) when it is wrong."""
    data = _mapping(data, source, TOP_KEYS)
    name = _name(data.get("name"), f"{source}: name")
    budget = bounded(data.get("budget"), f"{source}: budget", "budget", integer=False)
    tok = _mapping(data.get("tokenizer"), f"{source}: tokenizer", {"family", "vocab_size"})
    if "vocab_size" in tok:
        bounded(tok["vocab_size"], f"{source}: tokenizer.vocab_size", "vocab_size")
    family = tok.get("family", "bert")
    if not isinstance(family, str) or family not in TOKENIZER_KINDS:
        _fail(f"{source}: tokenizer.family", f"{family!r} is not one of {', '.join(TOKENIZER_KINDS)}")
    if family != "words":  # the least a kind takes (roberta: 261), as tokenizer train says
        _built(lambda given: TokenizerOptions(**given), {"kind": TOKENIZER_KINDS[family], "family": family,
               "vocab_size": tok.get("vocab_size", 2000)}, f"{source}: tokenizer")
    tasks = _tasks(data.get("tasks"), f"{source}: tasks")
    arms = _arms(data.get("arms"), f"{source}: arms")
    pretrain = _mapping(data.get("pretrain"), f"{source}: pretrain")
    finetune = _mapping(data.get("finetune"), f"{source}: finetune")
    _check_recipes(pretrain, finetune, arms, source)
    check_finetune_reads(finetune, tasks, f"{source}: finetune", _fail, arms)
    return Plan(name=name, budget=float(budget), corpus=check_corpus(data.get("corpus"), f"{source}: corpus"),
                tokenizer={"family": "bert", "vocab_size": 2000, **tok}, pretrain=pretrain, finetune=finetune,
                tasks=tasks, seeds=check_seeds(data.get("seeds"), f"{source}: seeds"), arms=arms,
                claims=_claims(data.get("claims"), {a.name for a in arms}, {t["name"] for t in tasks},
                               f"{source}: claims"), source=source)


def load_plan(path) -> Plan:
    """A plan from a YAML or JSON file, or a shipped plan's name (electra, roberta, ...)."""
    path = plan_file(path)
    try:
        text = path.read_text(encoding="utf-8")
        data = jsontext.loads(text) if path.suffix == ".json" else load_yaml(text)
    except (OSError, UnicodeDecodeError, ValueError, yaml.YAMLError) as err:
        raise PlanError(f"cannot read plan {path}: {str(err).splitlines()[0]}") from None
    return check_plan(data, path.name)
