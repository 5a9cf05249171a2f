"""What a plan gives that its runs read, and nothing else (plan.py calls these while it checks a plan):
an arm's objective options are keyword arguments its objective is built with, an arm that does not
pretrain gives nothing only pretraining reads, static masking needs an objective that draws a
corruption, and a downstream task gives the fields of its own source. A field no run would read is a
refusal naming it, before any work, never a silent no-op (nor a traceback hours into the run)."""
from __future__ import annotations

import inspect

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


def check_arm_reads(arm, spec, where: str, fail) -> None:
    """fail(field, why) for the first field of `arm` (objective `spec`) that its runs would not read."""
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
