"""An int8-quantised model is refused, in one line, by what would train it: a new task head, a teacher."""
import pytest

from lmforge.compress.quantize import quantize
from lmforge.heads import attach
from lmforge.objectives import Distillation, student_from_teacher
from lmforge.tasks import task_class
from tests.tasks.core import tiny, tokenizer


def test_a_new_task_head_on_an_int8_model_is_refused():
    model = quantize(tiny("bert-base"), "dynamic")
    # the same words whether it came to be trained or evaluated: the head it lacks, then the way out
    expected = ("the model is int8-quantised .*: it has no classification head to run, and a new one "
                "cannot be trained on it: fine-tune the fp32 model")
    with pytest.raises(ValueError, match=expected):
        task_class("cls")(model, tokenizer("bert"), labels=["neg", "pos"])


def test_an_int8_teacher_is_refused():
    teacher = tiny("bert-base", n_layers=2)
    attach(teacher, "lm")
    teacher = quantize(teacher, "dynamic")
    with pytest.raises(ValueError, match="the teacher is int8-quantised .*fp32 model"):
        student_from_teacher(teacher)
    with pytest.raises(ValueError, match="the teacher is int8-quantised"):
        Distillation(tiny("bert-base", n_layers=1), teacher, mask_id=3)
