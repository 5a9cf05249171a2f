"""Running a plan: every arm x seed pretrained for its share of the budget, then fine-tuned on
every task with one recipe; one JSON line per (arm, seed, task) in OUT/results.jsonl.

Layout under OUT: corpus/ (the plan's text, written once), tokenizers/KEY/tokenizer (trained once, shared by
every arm), tasks/NAME-KEY.json (the downstream splits), ARM/seed-S/pretrain (a `lmforge pretrain` run
directory: metrics.jsonl, checkpoints/, final/) and ARM/seed-S/TASK (a fine-tuning run), and schedule.json
(each arm's steps and counted FLOPs); built.json keeps the checksums of the corpus files (the plan's own too:
plan_corpus), which a rerun reads verified (results.built_files), as it reads the tokenizer's (run_tokenizer).
Pretraining goes through train.pretrain.pretrain, the code `lmforge pretrain` runs; an arm's objective options
and example format become a spec registered for the run only (objectives.registry), so the recipe itself is
unchanged.

Resuming is arm by arm: a (arm, seed, task) line already in results.jsonl (each verified against
its checksum, a torn last line cut: results.py) is skipped when its fingerprint is the plan's
(fingerprint.py: a changed plan reruns what it changed, and says so); a pretraining run with
checkpoints continues from the newest (checkpoints every quarter of its steps);
an unfinished fine-tuning run starts again. The same seed gives the same numbers (every draw is seeded).
"""
from __future__ import annotations

import dataclasses
import json
import shutil
import time
from contextlib import contextmanager
from pathlib import Path

from lmforge import objectives
from lmforge.bakeoff.corpus import topic_task
from lmforge.bakeoff.fingerprint import pretrain_key, result_key, schedule_key, task_key, tokenizer_key
from lmforge.bakeoff.flops import TOLERANCE, Schedule, schedule
from lmforge.bakeoff.layout import LOG, SCHEDULE, TASKS, TOKENIZERS
from lmforge.bakeoff.plan_corpus import corpus_files
from lmforge.bakeoff.plan import BOUNDS, Arm, Plan, PlanError, split_finetune
from lmforge.bakeoff.plan_reads import TEXT_TO_TEXT, check_finetune_len, read_by_kind
from lmforge.bakeoff.results import RESULTS  # noqa: F401 (callers read it here)
from lmforge.bakeoff.results import (append_row, hardware, mend, read_results, read_signed, replace_row,
                                     write_signed)
from lmforge.bakeoff.sample import Sampler
from lmforge.config import atomic_write_text
from lmforge.presets import get_config
from lmforge.train import TrainConfig
from lmforge.train.checkpoint import checkpoints
from lmforge.train.pretrain import pretrain, read_documents, sized_to
from lmforge.train.tokenizer_run import run_tokenizer
from lmforge.utils.atomic import append_text
from lmforge.utils.ranks import one_process

CHECKPOINTS_PER_RUN = 4  # an interrupted pretraining run loses at most a quarter of its steps
STAMP = "plan.json"  # in a pretraining run's directory: the fingerprint of what it trains


def task_splits(task: dict, out: Path) -> dict:
    """{"kind", "splits"} of a downstream task, built once into OUT/tasks/NAME.json (verified on read)."""
    path = out / TASKS / f"{task['name']}-{task_key(task)}.json"  # a changed task: new splits
    if path.is_file():
        return read_signed(path)
    n = task.get("n_per_label", 100)
    if task["source"] == "gcide-pos":
        from lmforge.data.dictionary import pos_task

        data = {"kind": "cls", "splits": pos_task(n, seed=0)}
    elif task["source"] == "foldoc-topic":
        data = {"kind": "cls", "splits": topic_task(n, seed=0)}
    else:
        from lmforge.tasks.formats import builtin

        kind, splits = builtin(task.get("task", task["name"]), n=task.get("n", 1000), seed=0)
        data = {"kind": kind, "splits": splits}
    path.parent.mkdir(parents=True, exist_ok=True)
    write_signed(path, data)
    return data


def arm_spec(plan: Plan, arm: Arm):
    """The arm's objective as a spec of its own: the registered one with the arm's options and
    example format (a spec named bakeoff.PLAN.ARM)."""
    spec = objectives.get(arm.objective)
    try:
        examples = dataclasses.replace(spec.examples, **arm.examples)
    except (TypeError, ValueError) as err:
        raise PlanError(f"{plan.source}: arms.{arm.name}.examples: {err}") from None
    return dataclasses.replace(spec, name=f"bakeoff.{plan.name}.{arm.name}", aliases=(),
                               options={**spec.options, **arm.options}, examples=examples)


@contextmanager
def registered(specs: list):
    """The arms' specs in the objective registry for the duration of the run."""
    for spec in specs:
        objectives.registry.register(spec)
    try:
        yield
    finally:
        for spec in specs:
            objectives.registry.unregister(spec.name)


def arm_config(plan: Plan, arm: Arm, vocab_size: int):
    """The model config an arm trains (a continued arm: the config of the arm it continues; a
    checkpoint's own, its vocabulary included)."""
    while arm.continue_from is not None:
        arm = plan.arm(arm.continue_from)
    if arm.model is not None:
        from lmforge.io import find_model_dir, load

        return load(find_model_dir(arm.model)).config
    return get_config(arm.preset, **arm.overrides).replace(vocab_size=vocab_size)


def pretrain_options(plan: Plan, arm: Arm) -> dict:
    """The arm's TrainConfig options (the plan's, then its own) and its max_len."""
    options = {**plan.pretrain, **arm.train}
    return options, options.pop("max_len", None)


def schedules(plan: Plan, vocab_size: int, measure=None) -> dict:
    """arm name -> flops.Schedule within TOLERANCE of the budget (measure: sample.Sampler); else PlanError."""
    out = {}
    for arm in plan.arms:
        cfg = arm_config(plan, arm, vocab_size)
        options, max_len = pretrain_options(plan, arm)
        train = TrainConfig.from_dict(options)
        T = max_len or min(cfg.max_seq_len, 128)
        if T > cfg.max_seq_len:  # pretrain refuses it when the arm starts: a dry run counted steps never run
            raise PlanError(f"{plan.source}: arms.{arm.name}: max_len {T} is over the model's max_seq_len "
                            f"({cfg.max_seq_len})")
        check_finetune_len(plan.finetune, cfg, f"{plan.source}: arms.{arm.name}", PlanError)
        if not arm.pretrain:  # a baseline fine-tuned as it is: no FLOPs of its own
            out[arm.name] = Schedule(0, 0.0, 0.0, {})
            continue
        try:
            spec = arm_spec(plan, arm)
            found = schedule(spec, cfg, T, train.batch_size * train.accumulation, plan.budget, arm.options,
                             train.batch_size, measure(arm, spec, T, train.batch_size) if measure else None)
        except PlanError:  # it names the plan and the arm already
            raise
        except ValueError as err:  # an objective option out of its range (ratio: 1.5), said by the objective
            raise PlanError(f"{plan.source}: arms.{arm.name}: {str(err).splitlines()[0]}") from None
        if found.steps > BOUNDS["steps"][1]:
            raise PlanError(f"{plan.source}: budget: buys arm {arm.name} {found.steps} steps, over the bound "
                            f"on steps ({BOUNDS['steps'][1]}): lower the budget")
        if found.error(plan.budget) > TOLERANCE:
            raise PlanError(f"{plan.source}: arms.{arm.name}: the budget buys {found.steps} step(s) of "
                            f"{found.flops_per_step:.3g} FLOPs, {100 * found.error(plan.budget):.1f} % off: "
                            f"raise budget or lower batch_size")
        out[arm.name] = found
    return out


def check_objectives(plan: Plan, tokenizer) -> None:
    """Each pretraining arm's objective built once with the run's tokenizer around a weightless model (meta
    device), before any arm trains or is sampled: an option out of range (mlm's rate: 0) is a PlanError
    naming the arm. An arm from a checkpoint (its own tokenizer) is checked when it starts."""
    import torch

    from lmforge.model import from_config

    for arm in plan.arms:
        root = arm
        while root.continue_from is not None:
            root = plan.arm(root.continue_from)
        if not arm.pretrain or root.model is not None:
            continue
        try:
            with torch.device("meta"):
                cfg = sized_to(arm_config(plan, arm, tokenizer.vocab_size), tokenizer, None, None)
                arm_spec(plan, arm).make(from_config(cfg), tokenizer)
        except ValueError as err:  # said by the objective: its options, or the tokenizer it needs
            raise PlanError(f"{plan.source}: arms.{arm.name}: {str(err).splitlines()[0]}") from None


class BakeOff:
    """One plan's run under `out`: corpus, tokenizer, schedules, then arm by arm (see the module)."""

    def __init__(self, plan: Plan, out, log=print) -> None:
        one_process("bakeoff", PlanError)  # every rank would run every arm: world x the budget
        self.plan, self.out, self.show = plan, Path(out), log
        self.out.mkdir(parents=True, exist_ok=True)
        mend(self.out)  # a torn last row (a kill mid-append) cut, before hours of training rest on the file
        self.done = {(r["arm"], r["seed"], r["task"]): r.get("fingerprint") for r in read_results(self.out)}
        self.corpus = corpus_files(plan.corpus, self.out)  # a changed file of it refused (plan_corpus)
        docs = read_documents(self.corpus)
        # trained once, verified on every rerun (train.pretrain.run_tokenizer keeps its checksums)
        self.tokenizer = run_tokenizer(self.out / TOKENIZERS / tokenizer_key(plan),
                                       plan.tokenizer["family"], docs, plan.tokenizer["vocab_size"])
        check_objectives(plan, self.tokenizer)  # cheap, before each arm's examples are sampled
        self.schedules = schedules(plan, self.tokenizer.vocab_size, Sampler(self))
        self.architectures: dict = {}  # arm name -> its model's architecture, read once (architecture)
        self.tasks = {t["name"]: task_splits(t, self.out) for t in plan.tasks}
        self.units = len(plan.arms) * len(plan.seeds) * (1 + len(plan.tasks))
        self.finished = self.ran = 0  # units of the plan done, and done by this process
        self.start = time.monotonic()
        atomic_write_text(self.out / SCHEDULE, json.dumps(
            {arm.name: {**dataclasses.asdict(self.schedules[arm.name]), "budget": plan.budget,
                        "fingerprint": schedule_key(plan, arm)} for arm in plan.arms},
            indent=1) + "\n")

    def detail(self, line: str) -> None:
        """A line of the runs' own logs (pretraining, fine-tuning): OUT/bakeoff.log only."""
        append_text(self.out / LOG, line + "\n")

    def log(self, line: str) -> None:
        """A line of the plan's progress: shown and kept in OUT/bakeoff.log."""
        self.detail(line)
        self.show(line)

    def progress(self, what: str) -> None:
        """One line of progress across the whole plan, with a rough time left (units done so far)."""
        self.finished += 1
        elapsed, self.ran = time.monotonic() - self.start, self.ran + 1
        left = elapsed / self.ran * (self.units - self.finished)
        self.log(f"[bakeoff {self.plan.name}] {self.finished}/{self.units} "
                 f"({100 * self.finished / self.units:.0f} %, {elapsed / 60:.1f} min, "
                 f"~{left / 60:.0f} min left): {what}")

    def run(self) -> list:
        """Every arm x seed x task not yet in results.jsonl; returns all rows."""
        specs = [arm_spec(self.plan, arm) for arm in self.plan.arms]
        with registered(specs):
            for arm, spec in zip(self.plan.arms, specs):
                for seed in self.plan.seeds:
                    self.run_arm(arm, spec, seed)
        return read_results(self.out)

    def arm_dir(self, arm: str, seed: int) -> Path:
        """Where an arm's runs of one seed live."""
        return self.out / arm / f"seed-{seed}"

    def run_arm(self, arm: Arm, spec, seed: int) -> None:
        """Pretrain (or resume) one arm at one seed, then fine-tune and test it on every task."""
        keys = {t["name"]: result_key(self.plan, arm, seed, t) for t in self.plan.tasks}
        todo = [t for t in self.tasks if self.done.get((arm.name, seed, t)) != keys[t]]
        if not todo:
            self.finished += 1 + len(self.tasks)
            self.log(f"[bakeoff {self.plan.name}] {arm.name} seed {seed}: done already")
            return
        changed = [t for t in todo if (arm.name, seed, t) in self.done]
        if changed:
            self.log(f"[bakeoff {self.plan.name}] {arm.name} seed {seed}: the plan changed since the "
                     f"result(s) of {', '.join(changed)} (arm, budget or its count, corpus, recipe, task): "
                     "running again")
        kept = arm.pretrain and self.pretrained(arm, seed)
        model = self.pretrain(arm, spec, seed)
        steps = self.schedules[arm.name].steps
        self.progress(f"{arm.name} seed {seed}: no pretraining of its own ({model})" if not arm.pretrain
                      else f"{arm.name} seed {seed}: pretrained already ({steps} steps), kept" if kept
                      else f"pretrained {arm.name} seed {seed} ({steps} steps)")
        self.finished += len(self.tasks) - len(todo)
        for task in todo:
            row = {**self.finetune(arm, seed, task, model), "fingerprint": keys[task],
                   "hardware": self.hardware_of(arm, seed)}
            self.record(row)
            self.progress(f"{arm.name} seed {seed} {task}: {row['metric']} {row['value']:.4f}")

    def record(self, row: dict) -> None:
        """Add a result row (with its checksum) to results.jsonl, dropping an older row of its unit (arm,
        seed, task)."""
        unit = (row["arm"], row["seed"], row["task"])
        if unit not in self.done:
            append_row(self.out, row)
        else:  # a result of a changed plan: replaced, never averaged with the new one
            replace_row(self.out, row)
        self.done[unit] = row["fingerprint"]

    def final_of(self, arm: Arm, seed: int) -> Path:
        """The model an arm leaves for fine-tuning (and for the arms continuing it): its pretraining's
        final/, or, without pretraining of its own, the model it starts from."""
        if arm.pretrain:
            return self.arm_dir(arm.name, seed) / "pretrain" / "final"
        return self.source_of(arm, seed)

    def source_of(self, arm: Arm, seed: int) -> Path | None:
        """The model an arm starts from: another arm's, a checkpoint, or None (a fresh preset)."""
        if arm.continue_from is not None:
            return self.final_of(self.plan.arm(arm.continue_from), seed)
        if arm.model is not None:
            from lmforge.io import find_model_dir

            return find_model_dir(arm.model)
        return None

    def pretrain(self, arm: Arm, spec, seed: int) -> Path:
        """The arm's pretrained model directory, training (or resuming) it unless it is there."""
        out, source = self.arm_dir(arm.name, seed) / "pretrain", self.source_of(arm, seed)
        steps = self.schedules[arm.name].steps
        if not arm.pretrain:
            return self.final_of(arm, seed)
        key = pretrain_key(self.plan, arm, seed)
        if self.pretrained(arm, seed):
            return self.final_of(arm, seed)
        if out.exists() and self.stamp_of(out) != key:  # trained (or begun) for another plan: start again
            self.log(f"[bakeoff {self.plan.name}] {arm.name} seed {seed}: the plan changed since its "
                     f"pretraining (arm, seed, budget, corpus or recipe): pretraining again")
            shutil.rmtree(out)
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out / STAMP, json.dumps({"fingerprint": key}) + "\n")
        options, max_len = pretrain_options(self.plan, arm)
        train = TrainConfig.from_dict({"progress": False, "log_every": max(1, steps // 50),
                                       "save_every": max(1, steps // CHECKPOINTS_PER_RUN), **options,
                                       "steps": steps, "seed": seed})
        pretrain(spec.name, out, train, preset=arm.preset, data=self.corpus_of(arm),
                 tokenizer=None if arm.model else self.tokenizer,  # a checkpoint reads with its own
                 overrides=arm.overrides if source is None else None, duplication=arm.duplication,
                 resume=bool(checkpoints(out / "checkpoints")),  # a rerun continues, a first run starts
                 model=source, max_len=max_len, log=self.detail)
        done = {"steps": steps, "hardware": hardware(train.device)}  # the report names it
        atomic_write_text(out / "done.json", json.dumps(done) + "\n")
        return out / "final"

    def hardware_of(self, arm: Arm, seed: int) -> dict:
        """{"pretrain": what the arm's pretraining ran on (its done.json; None: none, or not recorded),
        "finetune": what fine-tuning runs on}."""
        path = self.arm_dir(arm.name, seed) / "pretrain" / "done.json"
        try:
            done = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            done = {}
        pretrained = done.get("hardware") if arm.pretrain and isinstance(done, dict) else None
        device = split_finetune(self.plan.finetune)[0].get("device", "auto")
        return {"pretrain": pretrained, "finetune": hardware(device)}

    def pretrained(self, arm: Arm, seed: int) -> bool:
        """Whether the arm's pretraining at `seed` is finished for this plan (fingerprint, done.json)."""
        out = self.arm_dir(arm.name, seed) / "pretrain"
        return self.stamp_of(out) == pretrain_key(self.plan, arm, seed) and (out / "done.json").is_file()

    @staticmethod
    def stamp_of(out: Path) -> str | None:
        """The fingerprint a pretraining run directory was started for (None: none, or unreadable)."""
        try:
            return json.loads((out / STAMP).read_text(encoding="utf-8")).get("fingerprint")
        except (OSError, ValueError, AttributeError):
            return None

    def corpus_of(self, arm: Arm) -> list:
        """The files an arm pretrains on: its own corpus or the plan's, verified again at each use (a file
        edited while the plan runs is refused before an arm trains on it)."""
        return corpus_files(arm.corpus or self.plan.corpus, self.out)

    def architecture(self, arm: Arm) -> str:
        """The architecture of an arm's model, read once a run (an arm from a checkpoint loads it)."""
        if arm.name not in self.architectures:
            self.architectures[arm.name] = arm_config(self.plan, arm, self.tokenizer.vocab_size).architecture
        return self.architectures[arm.name]

    def finetune(self, arm: Arm, seed: int, task: str, model: Path | None) -> dict:
        """Fine-tune the pretrained `model` on `task` with the plan's recipe; the test-set row."""
        from lmforge.tasks.finetune import TaskConfig, evaluate, finetune, preset_model

        out = self.arm_dir(arm.name, seed) / task
        if model is None:  # a preset fine-tuned from its random init (drawn from the seed): no pretraining
            model = preset_model(arm.preset, self.tokenizer, arm.overrides, seed)
        shutil.rmtree(out, ignore_errors=True)  # an unfinished fine-tuning run starts again
        data = self.tasks[task]
        train, task_options = split_finetune(self.plan.finetune)
        # no eval_every in the plan: validated at the end alone, as its rows were made (their fingerprint)
        train_cfg = TrainConfig.from_dict({"progress": False, "eval_every": 0, **train, "seed": seed})
        splits = data["splits"]
        tokenizer = None if isinstance(model, Path) else self.tokenizer  # a directory reads with its own
        options = read_by_kind(task_options, data["kind"])
        if self.architecture(arm) != "encoder-decoder":
            options = {k: v for k, v in options.items() if k not in TEXT_TO_TEXT}  # the T5 / BART arms' alone
        finetune(model, tokenizer, data["kind"], splits["train"], splits["validation"], out, train_cfg,
                 TaskConfig.from_dict(options), log=self.detail)
        best = out / "best" if (out / "best").is_dir() else out / "final"
        metrics = evaluate(best, splits["test"], device=train_cfg.device)
        primary = next(iter(metrics))
        s = self.schedules[arm.name]
        return {"plan": self.plan.name, "arm": arm.name, "seed": seed, "task": task, "metric": primary,
                "value": metrics[primary], "metrics": metrics, "pretrain_steps": s.steps,
                "pretrain_flops": s.flops, "budget": self.plan.budget}
