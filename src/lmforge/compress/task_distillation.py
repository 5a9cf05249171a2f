"""Task-specific distillation: a fine-tuned teacher's soft labels train a smaller student.

    L = alpha * T^2 KL(softmax(z_t / T) || softmax(z_s / T)) + (1 - alpha) * CE(z_s, y)
        + gamma * (1 - cos(h_s, h_t))

The first term is Hinton et al. (2015)'s soft targets at temperature T (the T^2 keeps its
gradients on the scale of the hard term's as T grows; objectives/distilbert.py's
soft_cross_entropy), the second the gold labels, the third DistilBERT's cosine between the
last hidden states (Sanh et al. 2019), over real tokens, off unless gamma > 0. The student
starts from the teacher as DistilBERT's (sec. 3): every other layer, or the first N, its
embeddings and task head copied; or from a preset (random, a fresh head). Training is the one
trainer's: progress, metrics.jsonl, checkpoints, --resume, the seed.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F

from lmforge.compress.measure import measure_side_by_side
from lmforge.compress.model_files import output_folder
from lmforge.config import atomic_write_text, option
from lmforge.config.model import MAX_LAYERS
from lmforge.config.names import close_names
from lmforge.config.options import OptionsError, check_options, instance_of
from lmforge.io import model_dir as resolve_dir
from lmforge.objectives.base import TEMPERATURE_RANGE, WEIGHT_MAX, Loss, Objective
from lmforge.objectives.distilbert import (check_copyable, cosine_loss, every_other, refuse_int8_teacher,
                                           refuse_teacher, soft_cross_entropy, student_from_teacher,
                                           teacher_config)
from lmforge.presets import ELMO_PRESETS, PRESETS
from lmforge.tasks.fields import given_records, record_list
from lmforge.tasks.finetune import (HEAD_SEED, TaskConfig, Validator, check_validated, encode_split,
                                    fine_tuned_task, make_task, preset_model, write_task_files)
from lmforge.tasks.reference import saved_kind
from lmforge.train import TrainConfig, Trainer
from lmforge.train.checkpoint import RUN_FILES, training_folder
from lmforge.train.config import options_from_dict
from lmforge.train.data import derive_seed
from lmforge.train.run_folder import run_folder
from lmforge.utils.checksum import model_fingerprint
from lmforge.utils.ranks import one_process
from lmforge.utils.errors import shown

KINDS = ("cls", "pair")  # tasks whose logits are pooled from an encoder's hidden states
LOSS = ("temperature", "alpha", "gamma")  # the loss's options: key=value ones, reported as "loss"
DISTILL_WRITES = (*RUN_FILES, "distill.json")  # what a run writes under out


@dataclass
class DistillConfig:
    """Options of distillation: the loss, and the student (the teacher's layers, or a preset)."""

    temperature: float = option(2.0, "T of the soft targets (Hinton et al. 2015)", low=TEMPERATURE_RANGE[0],
                                high=TEMPERATURE_RANGE[1])
    alpha: float = option(0.5, "weight of the soft-target term; 1 - alpha weighs the gold labels", low=0,
                          high=1)
    gamma: float = option(0.0, "weight of the hidden-state cosine term (DistilBERT); 0: off", low=0,
                          high=WEIGHT_MAX)
    student_layers: int | str | None = option(None, "the teacher's layers the student copies: every-other, "
                                              "or N (the first N); null: every-other")
    student: str | None = option(None, "a preset student instead of the teacher's layers "
                                 "(random init, fresh head)")

    def __post_init__(self) -> None:
        check_options(self)  # types, finiteness (NaN passes every comparison) and bounds
        if self.alpha == 0 and self.temperature != DistillConfig.temperature:  # only the soft targets read it
            raise OptionsError(f"temperature={self.temperature}: softens the teacher's targets, which "
                               "alpha=0 leaves out of the loss", "temperature")
        if self.student is not None and self.student_layers is not None:
            raise OptionsError("give student_layers or student, not both", "student")
        if self.student is not None:
            student_preset(self.student)
        self.student_layers = parsed_layers(self.student_layers)  # "3" of a flag or a file: an int from here

    @classmethod
    def from_dict(cls, data: dict) -> DistillConfig:
        """Build from a dict; an unknown key is an error naming it."""
        return options_from_dict(cls, data, "distillation")


def student_preset(name) -> str:
    """`name` where it is a Transformer preset a student can be; else an OptionsError naming student, with
    the closest presets (closest_preset), on every face (DistillConfig; make_student, called alone)."""
    if not isinstance(name, str) or name not in PRESETS:  # a list (unhashable, `in` would raise): no preset
        raise OptionsError(f"student={shown(name)} is not a preset{closest_preset(str(name))}", "student")
    return name


def closest_preset(name: str) -> str:
    """"; did you mean bert-tiny, bert-mini?" (or the presets' list), worded as get_config hints, over the
    Transformer presets alone (get_config's hint would name ELMo's, which no student can be)."""
    if name in ELMO_PRESETS:
        return " a student can be (ELMo's is a biLSTM: no Transformer layers to distil into)"
    close = close_names(name, PRESETS)
    return f"; did you mean {', '.join(close)}?" if close else f"; presets: {', '.join(PRESETS)}"


def parsed_layers(layers, most: int = MAX_LAYERS, why: str = ""):
    """student_layers read once, on every face (DistillConfig; student_layers, against a teacher's `most`
    layers): None, "every-other", or a count from 1 to `most` as an int (given as one or as digits);
    anything else an OptionsError naming it."""
    if layers is None or layers == "every-other":
        return layers
    whole = isinstance(layers, int) and not isinstance(layers, bool)  # True is no count of layers
    # ASCII digits alone, and few: int() refuses "²" and 5,000 digits with bare ValueErrors of its own
    counted = layers.isascii() and layers.isdigit() and len(layers) < 20 if isinstance(layers, str) else whole
    if not (counted and 1 <= int(layers) <= most):
        said = f"expected every-other or a number of layers from 1 to {most}{why}"
        # "field=N: rule" and "field: rule, got 'text'": how the command line's flag_error and named_once
        # put --student-layers VALUE in the field's place (text may hold spaces, which "=" would split)
        raise OptionsError(f"student_layers={int(layers)}: {said}" if counted else
                           f"student_layers: {said}, got {str(layers)[:40]!r}", "student_layers")
    return int(layers)


def student_layers(spec, n_layers: int) -> tuple:
    """Teacher layers a student copies: "every-other" (0, 2, 4, ...) or an int N (the first N)."""
    # "abc" or 2.5 given here, outside DistillConfig: its refusal (int() had raised a bare ValueError)
    n = parsed_layers(spec, n_layers, f" (the teacher has {n_layers} layers)")
    return every_other(n_layers) if n in (None, "every-other") else tuple(range(n))


def make_student(teacher_task, layers=None, preset: str | None = None, seed: int = 0):
    """The student model: teacher blocks `layers` (see student_layers) or preset `preset`."""
    if preset is None:
        n_layers = teacher_task.model.config.n_layers
        return student_from_teacher(teacher_task.model, student_layers(layers, n_layers))
    student_preset(preset)  # DistillConfig's check: an OptionsError naming student (was a plain ValueError)
    shape = {"max_seq_len": teacher_task.model.config.max_seq_len}
    return preset_model(preset, teacher_task.tokenizer, shape, seed)


def _pooled(task, batch: dict) -> tuple:
    """(last hidden states (B, T, d), logits (B, labels)) of an encoder task."""
    hidden = task.model(batch["input_ids"], batch["attention_mask"], segment_ids=batch.get("segment_ids"),
                        run_heads=False).last_hidden_state
    return hidden, task.task_head(hidden, batch["attention_mask"]).float()


class TaskDistillation(Objective):
    """The student task learns from the frozen teacher task's logits (and hidden states)."""

    name = "task-distillation"

    def __init__(self, student, teacher, cfg: DistillConfig) -> None:
        super().__init__(student.model, student.pad_id)
        for role, task in (("teacher", teacher), ("student", student)):
            fine_tuned_encoder(task.kind, role)(task.model.config)
        if student.labels != teacher.labels:
            raise ValueError(f"the student's labels {student.labels} differ from the teacher's "
                             f"{teacher.labels}")
        if cfg.gamma and student.model.config.d_model != teacher.model.config.d_model:
            raise ValueError("gamma > 0 compares hidden states: it needs the teacher's d_model (or gamma=0)")
        # the student task's weights are self.model's: kept unregistered so checkpoints hold them once
        object.__setattr__(self, "student", student)
        self.cfg, self.teacher = cfg, teacher.requires_grad_(False).eval()

    def run_settings(self) -> dict:
        """The loss's options and the teacher (its fingerprint), as Distillation's: recorded in the
        Trainer's checkpoints, so a resume with others is refused (checkpoints carry the run's teacher)."""
        return {**{k: getattr(self.cfg, k) for k in LOSS}, "teacher": model_fingerprint(self.teacher.model)}

    def corrupt(self, example: dict, generator: torch.Generator) -> dict:
        """The student task's examples as they are."""
        return self.student.corrupt(example, generator)

    def collate(self, examples: list) -> dict:
        """The student task's batches (the teacher shares the tokenizer)."""
        return self.student.collate(examples)

    def train(self, mode: bool = True) -> TaskDistillation:
        """Train the student; the teacher stays in eval mode (no dropout)."""
        super().train(mode)
        self.teacher.eval()
        return self

    def forward(self, batch: dict) -> Loss:
        """alpha soft + (1 - alpha) hard (+ gamma cosine) on one batch; the teacher sees the same input."""
        with torch.no_grad():
            t_hidden, t_logits = _pooled(self.teacher, batch)
        s_hidden, s_logits = _pooled(self.student, batch)
        cfg, labels = self.cfg, batch["label"]
        soft = soft_cross_entropy(s_logits, t_logits, cfg.temperature)
        hard = F.cross_entropy(s_logits, labels)
        loss = cfg.alpha * soft + (1 - cfg.alpha) * hard
        metrics = {"soft_loss": soft.detach(), "hard_loss": hard.detach(),
                   "accuracy": (s_logits.argmax(-1) == labels).float().mean().detach(),
                   "agreement": (s_logits.argmax(-1) == t_logits.argmax(-1)).float().mean().detach()}
        if cfg.gamma:
            real = batch["attention_mask"].bool()
            cos = cosine_loss(s_hidden[real], t_hidden[real])
            loss, metrics["cos_loss"] = loss + cfg.gamma * cos, cos.detach()
        return Loss(loss, metrics)

    def heads(self) -> dict:
        """The student task's head."""
        return self.student.heads()

    def finish(self):
        """The student model with its task head."""
        return self.student.finish()


def fine_tuned_encoder(kind: str | None, role: str = "teacher"):
    """The rule (refuse_teacher's) of a `role` (teacher or student) fine-tuned for `kind`: an encoder
    fine-tuned for one of KINDS, before a student is cut from its layers or taught by it."""
    def rule(cfg) -> None:
        if kind not in KINDS or cfg.architecture != "encoder":
            raise ValueError(f"{cfg.architecture} fine-tuned for {kind}; the {role} must be an encoder "
                             f"fine-tuned for {' or '.join(KINDS)}")
    return rule


def check_teacher(teacher_dir, kind: str | None, student: str | None = None) -> None:
    """The teacher folder refused by its kind (task.json's `kind`) and its config.json alone, before any
    weight is read: an OptionsError naming teacher, as load_teacher and make_student refuse the model read.
    kind None (no task.json): nothing checked here, fine_tuned_task says what it needs."""
    folder = resolve_dir(teacher_dir) if kind is not None else None
    if folder is not None:
        copied = (check_copyable,) if student is None else ()  # student_from_teacher's rule: its layers
        refuse_teacher(f"teacher {teacher_dir}", teacher_config(folder), fine_tuned_encoder(kind), *copied)


def load_teacher(teacher_dir, train: list, checked: dict | None = None):
    """The teacher task at `teacher_dir`; an OptionsError naming teacher where it is int8-quantised or no
    fine_tuned_encoder (the command line says --teacher), or naming the source where records of `checked`
    ({source: records}) do not fit its labels."""
    teacher = fine_tuned_task(teacher_dir, train)
    try:
        refuse_int8_teacher(teacher.model)
    except ValueError as err:
        raise OptionsError(f"teacher {teacher_dir}: {err}", "teacher") from None
    # check_teacher's rule again, on the model read: a folder whose config.json alone did not read
    refuse_teacher(f"teacher {teacher_dir}", teacher.model.config, fine_tuned_encoder(teacher.kind))
    for source, records in (checked or {}).items():  # Python's read as a file's are, errors naming source
        encode_split(teacher, given_records(records, teacher.kind, source), source)  # before training
    return teacher


def distill(teacher_dir, train: list, valid: list | None, out, *, train_cfg: TrainConfig,
            cfg: DistillConfig | None = None, resume: bool = False, log=print,
            checked: dict | None = None) -> dict:
    """Distil the fine-tuned teacher at `teacher_dir` into a student on `train` records; writes
    metrics.jsonl, checkpoints/, best/, final/ and summary.json under `out`; returns the summary.
    checked: {source: records} the teacher's labels must fit, checked before training."""
    instance_of(train_cfg, TrainConfig, "train_cfg", False)  # an options object, not a dict of its fields
    cfg = instance_of(cfg, DistillConfig, "cfg") or DistillConfig()
    out = run_folder(_out_apart(out, teacher_dir), resume)  # nor a run there not resumed: before any read
    check_validated(train_cfg, TaskConfig(), valid)  # eval_every, nothing to validate: refused (as finetune)
    kind = saved_kind(teacher_dir)  # the records checked before the teacher is loaded, by its task.json
    check_teacher(teacher_dir, kind, cfg.student)  # and the teacher by its kind and config.json alone
    train, valid = given_records(train, kind, "train"), valid and given_records(valid, kind, "validation")
    checked = {source: given_records(records, kind, source) for source, records in (checked or {}).items()}
    teacher = load_teacher(teacher_dir, train, checked)
    # Python's records read as a file's, as finetune reads them: an error names train or validation
    train, valid = (given_records(train, teacher.kind, "train"),
                    valid and given_records(valid, teacher.kind, "validation"))
    model = make_student(teacher, cfg.student_layers, cfg.student, train_cfg.seed)
    task_cfg = TaskConfig(max_len=teacher.max_len)
    with torch.random.fork_rng(devices=[]):  # a fresh head (preset student) is drawn from the run's seed
        torch.manual_seed(derive_seed(train_cfg.seed, HEAD_SEED))
        student = make_task(teacher.kind, model, teacher.tokenizer, train, task_cfg, teacher.labels)
    objective = TaskDistillation(student, teacher, cfg)
    validator, start = (Validator(student, valid, task_cfg, out) if valid else None), time.perf_counter()
    examples = encode_split(student, train, "training", trained="training")
    trainer = Trainer(objective, examples, train_cfg, out, log=log,
                      evaluator=validator)  # the loss's options and the teacher: objective.run_settings
    trainer.fit(resume=resume, final_files=(partial(write_task_files, student),))
    summary = {"task": teacher.kind, "steps": trainer.step, "seed": trainer.cfg.seed,
               "seconds": round(time.perf_counter() - start, 2),
               "student_layers": model.config.n_layers, "teacher_layers": teacher.model.config.n_layers,
               "loss": {k: getattr(cfg, k) for k in LOSS}}
    if validator is not None:
        if validator.last_step != trainer.step:
            validator(trainer)
        summary.update(final=validator.last, best=validator.best, best_step=validator.best_step)
    if trainer.main:
        atomic_write_text(out / "summary.json", json.dumps(summary, indent=2) + "\n")
    return summary


def _out_apart(out, teacher_dir):
    """`out`, or UnsafePath naming "out" where it is or holds the teacher's folder (as --out is): the run's
    final/ or best/ would replace the model it distils from (compress.model_files.output_folder)."""
    return output_folder(out, resolve_dir(teacher_dir), DISTILL_WRITES, "teacher_dir")


def run_distill(teacher_dir, train: list, valid: list | None, records: list, out, *, train_cfg: TrainConfig,
                cfg: DistillConfig | None = None, resume: bool = False, log=print,
                source: str = "data") -> dict:
    """`lmforge distill`: distil, then measure teacher and student (best/ if kept, else final/) side by
    side on `records` (read from `source`, checked against the teacher's labels before training):
    accuracy, parameters, size on disk, forward time; distill.json under `out`."""
    one_process("run_distill")
    out = training_folder(_out_apart(out, teacher_dir))
    records = record_list(records, source)  # read once: a generator is checked before training, used after
    summary = distill(teacher_dir, train, valid, out, train_cfg=train_cfg, cfg=cfg, resume=resume, log=log,
                      checked={source: records})
    student_dir = out / "best" if (out / "best").is_dir() else out / "final"
    records = given_records(records, summary["task"], source)  # as load_teacher checked them
    tasks = {"teacher": fine_tuned_task(teacher_dir, records),
             "student": fine_tuned_task(student_dir, records)}
    measured = measure_side_by_side(tasks, records, {"teacher": teacher_dir, "student": student_dir})
    t, s = measured["teacher"], measured["student"]
    report = {"teacher_dir": str(teacher_dir), "student_dir": str(student_dir), "steps": summary["steps"],
              "seed": summary["seed"],
              "train_seconds": summary["seconds"], "loss": summary["loss"],
              "layers": {"teacher": summary["teacher_layers"], "student": summary["student_layers"]},
              "teacher": t, "student": s, "metric_kept": s["metric"] / t["metric"] if t["metric"] else None,
              "speedup": measured["speedup"], "parameters_ratio": s["parameters"] / t["parameters"],
              "bytes_ratio": s["bytes"] / t["bytes"]}
    atomic_write_text(out / "distill.json", json.dumps(report, indent=2) + "\n")
    return report
