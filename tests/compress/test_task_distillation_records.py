"""run_distill's data records given as any iterable: read once, checked before training, measured after."""
import pytest

from lmforge.compress.task_distillation import run_distill
from lmforge.tasks.finetune import TaskConfig, make_task, save_model
from lmforge.train import TrainConfig
from tests.tasks.core import sentiment, tiny, tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny matrices: no waiting on a busy second core


def test_data_records_given_as_a_generator_are_measured_after_training(tmp_path):
    """A generator was consumed by the check before training, so the measurement after it found no records
    ("no examples to score", a plain ValueError, with final/ already written)."""
    data = sentiment(40)
    task = make_task("cls", tiny("bert-base", n_layers=2, n_heads=2), tokenizer(), data["train"],
                     TaskConfig(max_len=32))
    save_model(task, tmp_path / "teacher")
    cfg = TrainConfig(steps=1, batch_size=2, log_every=100, progress=False)
    records = (record for record in data["validation"][:8])
    report = run_distill(tmp_path / "teacher", data["train"][:8], None, records, tmp_path / "out",
                         train_cfg=cfg)
    assert 0 <= report["teacher"]["metric"] <= 1 and 0 <= report["student"]["metric"] <= 1
    assert (tmp_path / "out" / "distill.json").is_file()
