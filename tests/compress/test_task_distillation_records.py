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


@pytest.mark.parametrize("given, said", [({"train": [{"text": "good"}]}, "^train:1: "),
                                         ({"train": ["good"]}, "^train:1: a record is a dict"),
                                         ({"records": [{"txt": "good", "label": "pos"}]}, "^data:1: ")])
def test_bad_records_are_refused_before_the_teacher_is_loaded(tmp_path, monkeypatch, given, said):
    """The records were checked only after fine_tuned_task had loaded the teacher: now by the kind its
    task.json says, first (tasks.reference.saved_kind); the loader fails if it is reached."""
    import lmforge.tasks.finetune as finetune
    from lmforge.config.options import OptionsError

    data = sentiment(10)
    save_model(make_task("cls", tiny("bert-base", n_layers=1, n_heads=2), tokenizer(), data["train"],
                         TaskConfig(max_len=16)), tmp_path / "teacher")
    monkeypatch.setattr(finetune, "load_model", lambda *a, **k: pytest.fail("the teacher was loaded"))
    args = {"train": data["train"], "records": data["validation"], **given}
    with pytest.raises(OptionsError, match=said):
        run_distill(tmp_path / "teacher", args["train"], None, args["records"], tmp_path / "out",
                    train_cfg=TrainConfig(steps=1, batch_size=2, progress=False))


@pytest.mark.parametrize("resume", [False, True])
def test_an_out_holding_a_run_s_checkpoints_is_refused_naming_out_before_the_teacher_is_read(tmp_path,
                                                                                              resume):
    """distill(out=a folder holding checkpoints) without resume was refused only by Trainer.fit, once the
    teacher was loaded and a student cut from it: here the missing teacher was the error said."""
    from lmforge.compress.task_distillation import distill
    from lmforge.utils.atomic import UnsafePath

    out, teacher = tmp_path / "run", tmp_path / "missing"
    (out / "checkpoints" / "step-0000002").mkdir(parents=True)
    with pytest.raises(Exception) as err:
        distill(teacher, sentiment()["train"][:8], None, out, train_cfg=TrainConfig(steps=1), resume=resume)
    if resume:  # past the check: the teacher is read, and found missing
        assert not isinstance(err.value, UnsafePath) and f"{teacher} is neither a model" in str(err.value)
    else:
        assert isinstance(err.value, UnsafePath) and err.value.field == "out"
        assert str(err.value) == (f"out {out} already holds a run's checkpoints: pass resume=True (--resume) "
                                  "to continue it, or another folder")
