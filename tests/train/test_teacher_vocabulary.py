"""A distillation run's tokenizer of another vocabulary than its teacher's was refused only when the objective
was built (Distillation.build), after the teacher's weights and the whole corpus had been read; it is now
refused as soon as the teacher is had (train.pretrain.teacher_model), before the corpus is read: one line
naming tokenizer (the one given) or teacher (its folder's own), an OptionsError, exit 2."""
import pytest

import lmforge
import lmforge.train.pretrain as recipe
from lmforge.cli import main
from lmforge.config import OptionsError
from lmforge.tokenizer import train_tokenizer
from lmforge.train import TrainConfig

TEXTS = ["the cat sat on the mat", "a dog ran in the park", "birds sing in the morning"] * 4
SHAPE = {"n_layers": 2, "d_model": 32, "n_heads": 2, "d_ff": 64, "max_seq_len": 64}


class CorpusRead(Exception):
    """Raised in place of reading the corpus: the request got past every check."""


def corpus_read(*args, **kwargs):
    """pretrain's _corpus stood in for: reading the corpus raises CorpusRead."""
    raise CorpusRead


@pytest.fixture
def folders(tmp_path, monkeypatch):
    """(teacher folder with its own tokenizer, a folder of a tokenizer of another size, a data file); the
    corpus reader stood in for, so that reading it is said."""
    own = train_tokenizer(TEXTS, "wordpiece", 120, family="bert")
    teacher = tmp_path / "teacher"
    lmforge.build("bert-tiny", vocab_size=own.vocab_size, **SHAPE).save(teacher)
    own.save(teacher)
    other = train_tokenizer(TEXTS[:1], "wordpiece", 120, family="bert")  # fewer words: fewer ids
    assert other.vocab_size != own.vocab_size
    other.save(tmp_path / "other")
    (tmp_path / "c.txt").write_text("\n\n".join(TEXTS) + "\n")
    monkeypatch.setattr(recipe, "_corpus", corpus_read)
    return teacher, tmp_path / "other", tmp_path / "c.txt"


def test_another_tokenizer_is_refused_before_the_corpus_is_read_in_python(folders, tmp_path):
    teacher, other, data = folders
    with pytest.raises(OptionsError) as caught:
        recipe.pretrain("distillation", tmp_path / "o", TrainConfig(steps=1), teacher=str(teacher),
                        tokenizer=str(other), data=[str(data)], log=lambda line: None)
    assert caught.value.field == "tokenizer" and str(caught.value).startswith("tokenizer: ")
    assert "\n" not in str(caught.value) and not (tmp_path / "o").exists()


def test_another_tokenizer_beside_a_teacher_model_is_refused_before_the_corpus_is_read(folders, tmp_path):
    teacher, other, data = folders
    model = lmforge.load(teacher)
    with pytest.raises(OptionsError, match=f"^tokenizer: .* {model.config.vocab_size}") as caught:
        recipe.pretrain("distillation", tmp_path / "o", TrainConfig(steps=1), teacher=model,
                        tokenizer=str(other), log=lambda line: None)
    assert caught.value.field == "tokenizer" and not (tmp_path / "o").exists()


def test_another_tokenizer_exits_2_on_the_command_line_in_one_line_naming_it(folders, tmp_path, capsys):
    teacher, other, data = folders
    assert main(["pretrain", "--objective", "distillation", "--teacher", str(teacher), "--tokenizer",
                 str(other), "--data", str(data), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("lmforge pretrain: error: tokenizer: ") and len(err.splitlines()) == 1, err
    assert not (tmp_path / "o").exists()


def test_a_teacher_folder_whose_own_tokenizer_differs_is_refused_naming_teacher(folders, tmp_path):
    teacher, other, data = folders
    train_tokenizer(TEXTS[:1], "wordpiece", 120, family="bert").save(teacher)  # over the teacher's own
    with pytest.raises(OptionsError, match="^teacher: its folder's tokenizer") as caught:
        recipe.pretrain("distillation", tmp_path / "o", TrainConfig(steps=1), teacher=str(teacher),
                        data=[str(data)], log=lambda line: None)
    assert caught.value.field == "teacher" and not (tmp_path / "o").exists()


@pytest.mark.parametrize("given", [False, True])
def test_the_teachers_own_tokenizer_goes_on_to_read_the_corpus(folders, tmp_path, given):
    teacher, other, data = folders
    tokenizer = {"tokenizer": str(teacher)} if given else {}
    with pytest.raises(CorpusRead):
        recipe.pretrain("distillation", tmp_path / "o", TrainConfig(steps=1), teacher=str(teacher),
                        data=[str(data)], log=lambda line: None, **tokenizer)
    assert not (tmp_path / "o").exists()


def test_a_teacher_model_beside_shards_of_another_vocabulary_is_refused_before_the_corpus_is_read(folders,
                                                                                                tmp_path):
    """A teacher given as a model, no tokenizer=: the shards' tokenizer was checked only when the objective
    was built (Distillation.build, as 'the tokenizer given'); the shards say it before anything is read."""
    from lmforge.data.shards import shard_corpus

    teacher, other, data = folders
    shard_corpus([data], other, tmp_path / "shards", log=lambda *a: None)
    model = lmforge.load(teacher)
    with pytest.raises(OptionsError, match=f"^data: the shards' tokenizer has .* {model.config.vocab_size}: "
                                           "shard the text with the teacher's tokenizer$") as caught:
        recipe.pretrain("distillation", tmp_path / "o", TrainConfig(steps=1), teacher=model,
                        data=[str(tmp_path / "shards")], log=lambda line: None)
    assert caught.value.field == "data" and not (tmp_path / "o").exists()
    shard_corpus([data], teacher, tmp_path / "own", log=lambda *a: None)  # the teacher's: read on
    with pytest.raises(CorpusRead):
        recipe.pretrain("distillation", tmp_path / "o", TrainConfig(steps=1), teacher=model,
                        data=[str(tmp_path / "own")], log=lambda line: None)
