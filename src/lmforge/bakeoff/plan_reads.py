"""What a plan gives that its runs read, and nothing else (plan.py calls these while it checks a plan):
an arm's objective options are keyword arguments its objective is built with, an arm that does not
pretrain gives nothing only pretraining reads, static masking needs an objective that draws a
corruption, and a downstream task gives the fields of its own source. A field no run would read is a
refusal naming it, before any work, never a silent no-op (nor a traceback hours into the run)."""
from __future__ import annotations

import inspect
import math

from lmforge.config.options import OptionsError

PRETRAINING = ("options", "examples", "duplication", "train", "corpus")  # the arm fields pretraining reads
FROM_TOKENIZER = {"pad_id", "special_ids", "bos_id", "eos_id", "sentence_end"}  # what builds give themselves
TASK_FIELDS = {"gcide-pos": ("n_per_label",), "foldoc-topic": ("n_per_label",), "builtin": ("n", "task")}


def objective_keywords(spec) -> set:
    """The keyword arguments `spec`'s objective may be built with: its build's own, or where the build
    passes **options on, the class's (and the masked LM's it passes on) less those the build gives from
    the tokenizer."""
    from lmforge.bakeoff.flops import objective_options

    parameters = inspect.signature(spec.build).parameters.values()
    if all(p.kind is not inspect.Parameter.VAR_KEYWORD for p in parameters):
        return {p.name for p in parameters if p.default is not inspect.Parameter.empty}
    return set(objective_options(spec, {})) - FROM_TOKENIZER


def option_kind(value, default) -> str | None:
    """What an objective option whose default is `default` must be, where `value` is not that (a finite
    number, an integer, true or false, text, or a list of them for a tuple); None where it is, or where the
    default (None) says nothing."""
    if isinstance(default, tuple):
        listed = isinstance(value, (list, tuple))
        kinds = {option_kind(v, default[0]) for v in value} if listed and default else {None}
        return None if listed and kinds == {None} else f"a list like {list(default)}"
    if isinstance(default, bool):
        return None if isinstance(value, bool) else "true or false"
    if isinstance(default, (int, float)):
        number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        if isinstance(default, int):
            return None if number and isinstance(value, int) else "an integer"
        return None if number else "a finite number"
    if isinstance(default, str):
        return None if isinstance(value, str) else "text"
    return None


def check_arm_reads(arm, spec, where: str, fail) -> None:
    """fail(field, why) for the first field of `arm` (objective `spec`) that its runs would not read."""
    from lmforge.bakeoff.flops import objective_options
    from lmforge.train.pretrain_options import PretrainInputs, RecipeOptions, check_read

    if not arm.pretrain:
        given = next((key for key in PRETRAINING if getattr(arm, key) not in (None, {}, 0)), None)
        if given is not None:
            fail(f"{where}.{given}", "only pretraining reads it, and this arm has pretrain: false")
        return
    known = objective_keywords(spec)
    unknown = sorted(set(arm.options) - known)
    if unknown:
        fail(f"{where}.options.{unknown[0]}", f"not an option of objective {spec.name} (its options: "
                                              f"{', '.join(sorted(known)) or 'none'})")
    defaults = objective_options(spec, {})
    for key in sorted(arm.options):  # of its default's kind (a list rate was a traceback counting FLOPs)
        said = option_kind(arm.options[key], defaults.get(key))
        if said is not None:
            fail(f"{where}.options.{key}", f"must be {said}, got {arm.options[key]!r:.40}")
    try:
        check_read(spec, RecipeOptions(duplication=arm.duplication), PretrainInputs())
    except OptionsError as err:
        fail(f"{where}.duplication", str(err).split(": ", 1)[1])


def check_task_reads(task: dict, where: str, fail) -> dict:
    """The downstream `task`; fail(field, why) for a field of it that its source does not read."""
    read = TASK_FIELDS.get(task.get("source"), ())
    for key in sorted(set(task) - {"name", "source"} - set(read)):
        fail(f"{where}.{key}", f"source {task['source']} does not read it (it reads {', '.join(read)})")
    return task
