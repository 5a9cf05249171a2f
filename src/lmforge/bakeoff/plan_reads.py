"""What a plan gives that its runs read, and nothing else (plan.py calls these while it checks a plan):
an arm's objective options are keyword arguments its objective is built with, an arm that does not
pretrain gives nothing only pretraining reads, static masking needs an objective that draws a
corruption, and a downstream task gives the fields of its own source. A field no run would read is a
refusal naming it, before any work, never a silent no-op (nor a traceback hours into the run)."""
from __future__ import annotations

import dataclasses

from lmforge.config.options import OptionsError
from lmforge.objectives.keywords import check_keywords

PRETRAINING = ("options", "examples", "duplication", "train", "corpus")  # the arm fields pretraining reads
TEXT_TO_TEXT = ("prefix", "text_to_text")  # fine-tuning options an encoder-decoder arm alone reads (T5, BART)
TASK_FIELDS = {"gcide-pos": ("n_per_label",), "foldoc-topic": ("n_per_label",), "builtin": ("n", "task")}
EXAMPLE_KINDS = {"pairs": "pairs", "cross_documents": "sentences"}  # an example field -> its reading kind
MAX_CORPUS_FILES = 10_000  # a plan's corpus files, each checked at every use (plan_corpus), read once a run


def check_arm_reads(arm, spec, where: str, fail) -> None:
    """fail(field, why) for the first field of `arm` (objective `spec`) that its runs would not read."""
    from lmforge.train.pretrain_options import PretrainInputs, RecipeOptions, check_read

    if arm.continue_from is not None and arm.overrides:  # the runner builds the earlier arm's model as it is
        fail(f"{where}.overrides",
             "an arm continued from another takes that arm's model as it is: no overrides")
    if not arm.pretrain:
        given = next((key for key in PRETRAINING if getattr(arm, key) not in (None, {}, 0)), None)
        if given is not None:
            fail(f"{where}.{given}", "only pretraining reads it, and this arm has pretrain: false")
        return
    try:
        check_keywords(spec, arm.options, f"{where}.options")
    except OptionsError as err:  # its message begins with its field, which fail says once
        fail(err.field, str(err).removeprefix(f"{err.field}: "))
    try:  # the fields the runner gives the objective's ExampleFormat (runner.arm_spec)
        examples = dataclasses.replace(spec.examples, **arm.examples)
    except (ValueError, TypeError) as err:
        fail(f"{where}.examples", str(err).splitlines()[0])
    check_examples_read(arm.examples, examples.kind, f"{where}.examples", fail)
    try:
        check_read(spec, RecipeOptions(duplication=arm.duplication), PretrainInputs())
    except OptionsError as err:
        fail(f"{where}.duplication", str(err).split(": ", 1)[1])


def check_examples_read(examples: dict, kind: str, where: str, fail) -> None:
    """fail(field, why) for an example field that examples of `kind` do not read (pairs, for pairs; a
    sentences' cross_documents), or a cross_documents that is no bool: "no" (JSON text) read as true."""
    given = examples.get("cross_documents", False)
    if not isinstance(given, bool):
        fail(f"{where}.cross_documents", f"must be true or false, got {given!r}")
    for key in sorted(set(examples) & set(EXAMPLE_KINDS)):
        if EXAMPLE_KINDS[key] != kind:
            fail(f"{where}.{key}", f"read by examples of kind {EXAMPLE_KINDS[key]} alone, and this arm's are "
                                   f"{kind}")


def check_corpus_files(corpus: dict, where: str, fail) -> None:
    """fail(field, why) where a corpus of source files lists no file, more than MAX_CORPUS_FILES, or one
    that is no path (a number: a traceback at its run; "": the working folder read as the corpus), or gives
    documents or a seed (its files are read whole), or where another source is given files."""
    source, files = corpus.get("source", "gcide"), corpus.get("files")
    if source != "files":
        if "files" in corpus:
            fail(f"{where}.files", f"source {source} does not read it (source files does)")
        return
    if not isinstance(files, list) or not 1 <= len(files) <= MAX_CORPUS_FILES:
        fail(f"{where}.files", f"source files needs a list of 1 to {MAX_CORPUS_FILES} text files, got "
                               f"{len(files) if isinstance(files, list) else repr(files)[:60]}")
    for i, path in enumerate(files):
        if not isinstance(path, str) or not path.strip():
            fail(f"{where}.files[{i}]", f"must be a text file's path, got {path!r}"[:200])
    for key in ("documents", "seed"):
        if key in corpus:
            fail(f"{where}.{key}", "source files reads its files whole: it draws no documents")


def check_arm_counted(arm, spec, where: str, fail) -> None:
    """fail(objective, why) where a preset arm's objective has no FLOP count (flops.forward_flops): said
    while the plan is checked, not after its corpus and tokenizer are built. An option out of its range is
    left to the run's schedule, which says it in the objective's words."""
    from lmforge.bakeoff.flops import NoFlopCount, forward_flops
    from lmforge.presets import get_config

    if arm.preset is None or not arm.pretrain:
        return
    try:
        forward_flops(spec, get_config(arm.preset, **arm.overrides), 8, arm.options)
    except NoFlopCount as err:
        fail(f"{where}.objective", str(err).replace(repr(spec.name), repr(arm.objective)))
    except (ValueError, TypeError):
        pass


def check_task_reads(task: dict, where: str, fail) -> dict:
    """The downstream `task`; fail(field, why) for a field of it that its source does not read."""
    from lmforge.tasks.formats import BUILTIN

    read = TASK_FIELDS.get(task.get("source"), ())
    for key in sorted(set(task) - {"name", "source"} - set(read)):
        fail(f"{where}.{key}", f"source {task['source']} does not read it (it reads {', '.join(read)})")
    named = task.get("task", task.get("name"))  # a built-in task: `task`, else its name (runner.task_splits)
    if task.get("source") == "builtin" and (not isinstance(named, str) or named not in BUILTIN):
        fail(f"{where}.{'task' if 'task' in task else 'name'}",
             f"{named!r} is not a built-in task ({', '.join(BUILTIN)})"[:300])
    return task


def task_kind(task: dict) -> str | None:
    """The kind of a plan's downstream task (runner.task_splits builds it): cls, or a built-in task's own."""
    from lmforge.tasks.formats import BUILTIN

    return "cls" if task["source"] != "builtin" else BUILTIN.get(task.get("task", task["name"]))


def read_by_kind(options: dict, kind: str) -> dict:
    """The fine-tuning `options` a task of `kind` reads: the plan's recipe serves every task, each reading
    the options of its own kind (tagging's label_all, not qa's doc_stride); a prefix, read text-to-text."""
    from lmforge.tasks.base import option_owners

    owners = option_owners()
    return {k: v for k, v in options.items() if kind in owners.get(k, [kind]) or "text-to-text" in owners[k]}


def architecture(arm) -> str | None:
    """The architecture of an arm's model from its preset (None: from a checkpoint or another arm)."""
    from lmforge.presets import get_config

    return get_config(arm.preset, **arm.overrides).architecture if arm.preset is not None else None


def check_finetune_reads(finetune: dict, tasks: tuple, where: str, fail, arms: tuple = ()) -> None:
    """fail(field, why) for a fine-tuning option of a kind of task that no task of the plan is, or a
    text-to-text one where every arm is known to be no encoder-decoder (changed from its default): every
    fine-tuning run would leave it unread."""
    from lmforge.tasks.base import option_owners
    from lmforge.tasks.finetune import TaskConfig

    kinds, owners, defaults = {task_kind(t) for t in tasks}, option_owners(), TaskConfig()
    found = {architecture(arm) for arm in arms}
    for key in TEXT_TO_TEXT if found and None not in found and "encoder-decoder" not in found else ():
        if finetune.get(key) is not None:
            fail(f"{where}.{key}", f"read by encoder-decoder arms (T5, BART) alone, and the plan's arms are "
                                   f"{' and '.join(sorted(found))}")
    for key in sorted(set(finetune) & set(owners)):
        unread = not any(key in read_by_kind(finetune, kind) for kind in kinds)
        if unread and finetune[key] != getattr(defaults, key):
            fail(f"{where}.{key}", f"an option of {' and '.join(owners[key])} tasks, and no task of the plan "
                                   f"is one (its tasks: {', '.join(sorted(map(str, kinds)))})")


def check_finetune_len(finetune: dict, model_config, where: str, error=ValueError) -> None:
    """error naming `where` (the plan and its arm) and finetune.max_len where the recipe `finetune` sets it
    past the positions of the arm's model (config `model_config`), by fine-tuning's own check
    (tasks.base.check_max_len): fine-tuning says it when the arm's first task starts, after its pretraining
    has run (hours); the runner's schedules say it before any arm pretrains."""
    from lmforge.tasks.base import check_max_len
    from lmforge.tasks.finetune import TaskConfig

    options = {k: v for k, v in finetune.items() if k in TaskConfig.__dataclass_fields__}
    try:
        check_max_len(TaskConfig.from_dict(options), model_config)
    except OptionsError as err:
        raise error(f"{where}: finetune.{err}") from None
