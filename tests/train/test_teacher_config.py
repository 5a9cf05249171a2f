"""A distillation teacher folder the objective refuses by its config (ALBERT's one shared block, which a
student of every other layer cannot copy; a decoder) was refused only once its weights were read, ALBERT's
once the corpus was read too (Distillation.build): now from its config.json alone
(train.pretrain.teacher_model, objectives.distilbert.refuse_teacher), an OptionsError naming teacher, exit 2
on the command line."""
import pytest

import lmforge
import lmforge.train.pretrain as recipe
from lmforge.cli import main
from lmforge.config import OptionsError
from lmforge.train import TrainConfig
from tests.fifo import hf_folder_with_fifo, not_waiting

SHAPE = {"n_layers": 2, "d_model": 32, "n_heads": 2, "d_ff": 64, "max_seq_len": 64, "vocab_size": 100}
SHARED = "student_from_teacher takes an encoder or decoder with one block per layer"


class Read(Exception):
    """Raised in place of reading the teacher's weights or the corpus."""


def read(*args, **kwargs):
    raise Read


@pytest.fixture
def saved(tmp_path, monkeypatch):
    """save(preset) -> a folder of a tiny `preset` (its config.json, weights never to be read); the loader and
    the corpus reader stood in for, so that reading either raises Read."""
    def save(preset: str):
        lmforge.build(preset, **SHAPE).save(tmp_path / preset)
        return tmp_path / preset

    monkeypatch.setattr(recipe, "load", read)
    monkeypatch.setattr(recipe, "_corpus", read)
    return save


def test_an_albert_teacher_is_refused_by_its_config_before_its_weights_and_the_corpus(saved, tmp_path):
    teacher = saved("albert-base")
    with pytest.raises(OptionsError) as caught:
        recipe.pretrain("distillation", tmp_path / "o", TrainConfig(steps=1), teacher=str(teacher),
                        log=lambda line: None)
    assert caught.value.field == "teacher" and str(caught.value) == f"teacher {teacher}: {SHARED}"
    assert not (tmp_path / "o").exists()


def test_a_decoder_teacher_is_refused_by_its_config_naming_teacher(saved, tmp_path):
    teacher = saved("gpt2")
    with pytest.raises(OptionsError, match=f"^teacher {teacher}: objective 'distillation' does not fit a "
                                           r"decoder \(the teacher\): it trains encoder models$") as caught:
        recipe.pretrain("distillation", tmp_path / "o", TrainConfig(steps=1), teacher=str(teacher),
                        log=lambda line: None)
    assert caught.value.field == "teacher"


def test_a_bert_teacher_passes_its_config_and_is_read(saved, tmp_path):
    with pytest.raises(Read):
        recipe.pretrain("distillation", tmp_path / "o", TrainConfig(steps=1), teacher=str(saved("bert-base")),
                        log=lambda line: None)


def test_the_command_refuses_an_albert_teacher_in_one_line(saved, tmp_path, capsys):
    teacher = saved("albert-base")
    assert main(["pretrain", "--objective", "distillation", "--teacher", str(teacher), "--out",
                 str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err.strip() == f"lmforge pretrain: error: teacher {teacher}: {SHARED}"


def test_a_fifo_in_a_hugging_face_teacher_folder_is_refused_naming_it_not_waited_on(tmp_path):
    """teacher_config read a Hugging Face folder's generation_config.json before load's refusal of what is
    not a regular file: a FIFO there blocked the run forever (an alarm ends the wait, failing the test)."""
    from lmforge.io import CheckpointError

    teacher = hf_folder_with_fifo(tmp_path / "t", **SHAPE)
    with not_waiting(), pytest.raises(CheckpointError,
                                      match=r"generation_config.json is not a regular file \(a named"):
        recipe.pretrain("distillation", tmp_path / "o", TrainConfig(steps=1), teacher=str(teacher),
                        log=lambda line: None)
    assert not (tmp_path / "o").exists()  # a wait on the FIFO fails above, as a TimeoutError
