"""A teacher distillation refuses by its kind (no encoder; ALBERT's shared block, which a student of its
layers cannot copy) was refused only after its weights were read: now from its config.json and task.json alone
(task_distillation.check_teacher), on the Python face and before `lmforge distill` reads its records."""
import json

import pytest

import lmforge.cli.common as cli_common
import lmforge.tasks.finetune as finetune
from lmforge.cli import main
from lmforge.compress.task_distillation import DistillConfig, distill
from lmforge.config.options import OptionsError
from lmforge.tasks.finetune import TaskConfig, fine_tuned_task, make_task, save_model
from lmforge.train import TrainConfig
from tests.tasks.core import sentiment, tiny, tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny matrices: no waiting on a busy second core
SHARED = "student_from_teacher takes an encoder or decoder with one block per layer"


class Loaded(Exception):
    """Raised in place of reading a model's weights."""


def _loaded(*args, **kwargs):
    raise Loaded


def _saved(folder, preset: str, family: str = "bert"):
    """A fine-tuned cls folder (task.json) of a tiny untrained two-layer `preset`."""
    task = make_task("cls", tiny(preset, n_layers=2, n_heads=2), tokenizer(family), sentiment(20)["train"],
                     TaskConfig(max_len=16))
    save_model(task, folder)
    return folder


def _distill(teacher, out, student=None):
    return distill(teacher, sentiment(20)["train"][:4], None, out, train_cfg=TrainConfig(steps=1),
                   cfg=DistillConfig(student=student), log=lambda *a: None)


def test_an_albert_teacher_is_refused_by_its_config_before_its_weights_are_read(tmp_path, monkeypatch):
    teacher = _saved(tmp_path / "t", "albert-base")
    monkeypatch.setattr(finetune, "load_model", _loaded)
    with pytest.raises(OptionsError) as caught:
        _distill(teacher, tmp_path / "out")
    # the field, not the flag --teacher the Python caller never gave (the command line says --teacher: below)
    assert caught.value.field == "teacher" and str(caught.value) == f"teacher {teacher}: {SHARED}"
    with pytest.raises(Loaded):  # a preset student copies no block: the teacher is read, as before
        _distill(teacher, tmp_path / "out", student="bert-tiny")


def test_a_teacher_that_is_no_encoder_is_refused_by_its_config_before_its_weights(tmp_path, monkeypatch):
    teacher = _saved(tmp_path / "t", "gpt2", "gpt2")
    monkeypatch.setattr(finetune, "load_model", _loaded)
    said = f"teacher {teacher}: decoder fine-tuned for cls; the teacher must be an encoder fine-tuned for "
    for student in (None, "bert-tiny"):  # a student of its layers, or a preset it would teach
        with pytest.raises(OptionsError) as caught:
            _distill(teacher, tmp_path / "out", student)
        assert caught.value.field == "teacher" and str(caught.value) == said + "cls or pair"


def test_the_command_refuses_an_albert_teacher_before_reading_its_records(tmp_path, monkeypatch, capsys):
    teacher = _saved(tmp_path / "t", "albert-base")
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in sentiment(20)["train"][:4]))
    monkeypatch.setattr(finetune, "load_model", _loaded)
    monkeypatch.setattr(cli_common, "read_records", _loaded)
    assert main(["distill", "--teacher", str(teacher), "--train", str(tmp_path / "d.jsonl"), "--data",
                 str(tmp_path / "d.jsonl"), "--out", str(tmp_path / "out"), "--steps", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"lmforge distill: error: --teacher {teacher}: {SHARED}"
    assert not (tmp_path / "out").exists()


def test_an_int8_teacher_is_refused_naming_the_field_from_python(tmp_path, capsys):
    """distill(int8 teacher) said "--teacher DIR: ...", a flag the Python caller never gave: the field,
    teacher; the command line says --teacher (tests/compress/test_task_distillation.py)."""
    from lmforge.compress.quantize import quantize

    teacher = fine_tuned_task(_saved(tmp_path / "t", "bert-base"), sentiment(20)["train"], device="cpu")
    quantize(teacher.model, inplace=True)
    save_model(teacher, tmp_path / "int8")
    with pytest.raises(OptionsError) as python:
        _distill(tmp_path / "int8", tmp_path / "out")
    assert str(python.value).startswith(f"teacher {tmp_path / 'int8'}: ") and python.value.field == "teacher"
    assert "int8-quantised" in str(python.value) and "--teacher" not in str(python.value)
