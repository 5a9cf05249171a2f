"""TaskDistillation's rule for both of its tasks: each an encoder fine-tuned for a kind it distils, the
refusal naming which of the two is not."""
import pytest

from lmforge.compress.task_distillation import KINDS, DistillConfig, TaskDistillation
from lmforge.tasks.finetune import TaskConfig, make_task
from tests.tasks.core import sentiment, tiny, tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny matrices: no waiting on a busy second core


def test_either_task_of_another_kind_is_refused_naming_its_role():
    records, tok = sentiment(40)["train"][:8], tokenizer()
    cls = make_task("cls", tiny("bert-base", n_layers=1, n_heads=2), tok, records, TaskConfig(max_len=32))
    qa = make_task("qa", tiny("bert-base", n_layers=1, n_heads=2), tok, [], TaskConfig(max_len=32))
    assert "qa" not in KINDS
    for role, (student, teacher) in (("teacher", (cls, qa)), ("student", (qa, cls))):
        with pytest.raises(ValueError, match=f"^encoder fine-tuned for qa; the {role} must be an encoder "
                                             f"fine-tuned for {' or '.join(KINDS)}$"):
            TaskDistillation(student, teacher, DistillConfig())
    assert TaskDistillation(cls, cls, DistillConfig(gamma=0.0)).teacher is cls
