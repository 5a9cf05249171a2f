"""Bad task input through `lmforge finetune` / `lmforge evaluate`: exit status 2 and one line naming the
file, the field or the model; never a traceback, never a silent wrong result."""
import json

import pytest

from lmforge.cli import main
from lmforge.config import OptionsError
from tests.tasks.core import tiny, tokenizer

FAST = ["batch_size=4", "warmup=0", "progress=false"]
SQUAD = {"version": "v1.1", "data": [{"title": "T", "paragraphs": [{"context": "Ann ran home.", "qas": [
    {"id": "q1", "question": "Who ran?", "answers": [{"text": "Ann", "answer_start": 0}]}]}]}]}


def write(path, text):
    path.write_text(text, encoding="utf-8")
    return str(path)


def assert_refused(capsys, argv, *parts) -> str:
    """Run the command; it must exit 2 with one line on stderr holding every part."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    for part in parts:
        assert part in err, (part, err)
    return err


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny BERT with its tokenizer, never fine-tuned (no task.json, no task head)."""
    path = tmp_path_factory.mktemp("model")
    tiny(n_layers=1).save(path)
    tokenizer().save(path)
    return path


@pytest.fixture(scope="module")
def finetuned(model_dir, tmp_path_factory):
    """The model fine-tuned on a cls file for one step (OUT/final)."""
    root = tmp_path_factory.mktemp("run")
    train = write(root / "train.csv", "text,label\nIt is superb.,pos\nIt broke.,neg\n")
    assert main(["finetune", "--model", str(model_dir), "--task", "cls", "--train", train,
                 "--out", str(root / "out"), "--steps", "1", *FAST]) == 0
    return root / "out" / "final"


def test_labels_1_and_quoted_1_do_not_merge(model_dir, tmp_path, capsys):
    train = write(tmp_path / "train.jsonl", '{"text": "It is superb.", "label": 1}\n'
                  '{"text": "It broke.", "label": 0}\n{"text": "I love it.", "label": "1"}\n')
    assert_refused(capsys, ["finetune", "--model", str(model_dir), "--task", "cls", "--train", train,
                     "--out", str(tmp_path / "o"), "--steps", "1", *FAST],
            f"{train}:3: label \"1\" is also spelled 1 (line 1)")
    assert not (tmp_path / "o").exists()  # refused before anything was trained or written


@pytest.mark.parametrize("indent", [None, 2])
def test_squad_given_to_tagging_is_refused_naming_the_fields(model_dir, tmp_path, capsys, indent):
    squad = write(tmp_path / "squad.json", json.dumps(SQUAD, indent=indent))
    assert_refused(capsys, ["finetune", "--model", str(model_dir), "--task", "tagging", "--train", squad,
                     "--out", str(tmp_path / "o"), "--steps", "1", *FAST],
            squad, "it lacks 'words', 'tags'")


def test_records_without_the_tasks_fields_are_refused(model_dir, tmp_path, capsys):
    squad = write(tmp_path / "squad.json", json.dumps(SQUAD))
    assert_refused(capsys, ["finetune", "--model", str(model_dir), "--task", "cls", "--train", squad,
                     "--out", str(tmp_path / "o")], f"{squad}:1: no columns 'text', 'label'")
    conll = write(tmp_path / "ner.conll", "Ann B-PER\nran O\n")
    assert_refused(capsys, ["finetune", "--model", str(model_dir), "--task", "qa", "--train", conll,
                     "--out", str(tmp_path / "o")], conll, "not valid JSON")


def test_evaluate_refuses_a_model_never_fine_tuned_for_the_task(model_dir, finetuned, tmp_path, capsys):
    data = write(tmp_path / "test.csv", "text,label\nIt is superb.,pos\nIt broke.,neg\n")
    assert_refused(capsys, ["evaluate", "--model", str(model_dir), "--task", "cls", "--data", data],
            f"{model_dir} was never fine-tuned for cls")
    assert_refused(capsys, ["evaluate", "--model", str(finetuned), "--task", "pair", "--data",
                     write(tmp_path / "pair.csv", "text,text_pair,label\na,b,pos\n")],
            f"{finetuned} was fine-tuned for cls, not pair")
    assert main(["evaluate", "--model", str(finetuned), "--data", data]) == 0  # its own task: scored


def test_evaluate_names_a_record_without_its_label(finetuned, tmp_path, capsys):
    data = write(tmp_path / "test.jsonl", '{"text": "It is superb.", "label": "pos"}\n'
                 '{"text": "It broke."}\n')
    assert_refused(capsys, ["evaluate", "--model", str(finetuned), "--data", data], f"{data}:2: no label")
    csv = write(tmp_path / "test.csv", "text,label\nIt is superb.,\nIt broke.,neg\n")
    assert_refused(capsys, ["evaluate", "--model", str(finetuned), "--data", csv], f"{csv}:2: no label")


def test_evaluate_says_unlabelled_records_get_no_metrics(finetuned, tmp_path, capsys):
    data = write(tmp_path / "new.jsonl", '{"text": "It is superb."}\n{"text": "It broke."}\n')
    assert main(["evaluate", "--model", str(finetuned), "--data", data]) == 0
    assert "no metrics: the records carry no labels" in capsys.readouterr().err


def test_evaluate_api_refuses_mixed_gold_and_a_fresh_head(model_dir, finetuned):
    from lmforge.tasks.finetune import evaluate

    mixed = [{"text": "It is superb.", "label": "pos", "line": 1},
             {"text": "It broke.", "label": None, "line": 2}]
    with pytest.raises(ValueError, match="data:2: no label"):
        evaluate(finetuned, mixed)
    labelled = [mixed[0], {"text": "It broke.", "label": "neg", "line": 2}]  # two labels: a head to draw
    with pytest.raises(ValueError, match="never fine-tuned for cls"):
        evaluate(model_dir, labelled, "cls")


def test_evaluate_reads_records_once_from_any_iterable_and_refuses_none(finetuned):
    """A generator of records is scored as the list is (the gold check had used it up: 'no examples to
    score'); None is refused naming the records, not a TypeError."""
    from lmforge.tasks.finetune import evaluate

    records = [{"text": "It is superb.", "label": "pos"}, {"text": "It broke.", "label": "neg"}]
    assert evaluate(finetuned, (r for r in records)) == evaluate(finetuned, records)
    with pytest.raises(ValueError, match="data: a list of records .* got NoneType"):
        evaluate(finetuned, None)


def test_eval_every_zero_or_left_out_passes_without_validation_records():
    """eval_every's default became null (a tenth where the run validates): an options file of the old
    listing's eval_every: 0, which reads nothing either, had been refused as set."""
    from lmforge.tasks.finetune import TaskConfig, check_validated
    from lmforge.train import TrainConfig

    for given in ({}, {"eval_every": 0}):
        check_validated(TrainConfig.from_dict(given), TaskConfig())
    with pytest.raises(OptionsError, match="eval_every=5: a setting of validation"):
        check_validated(TrainConfig(eval_every=5), TaskConfig())


def test_a_reference_head_of_several_readings_asks_for_its_kind_naming_them(tmp_path):
    """A converted (or Hugging Face) single-label classifier may be cls or pair: the refusal had said the
    folder has no task.json, where it has one that names both."""
    transformers = pytest.importorskip("transformers")
    from lmforge.tasks.finetune import fine_tuned_task

    transformers.BertForSequenceClassification(transformers.BertConfig(
        vocab_size=40, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
        num_labels=3)).save_pretrained(tmp_path)
    with pytest.raises(OptionsError, match=r"kind is needed \(kind=; --task on the command line\): "
                                           r".* may be read as cls or pair") as err:
        fine_tuned_task(tmp_path, [])
    assert err.value.field == "kind"


def test_python_refusals_are_typed_and_come_before_any_work(model_dir, tmp_path):
    """evaluate of a missing folder blamed the task kind (naming the command line's --task); an empty train
    list failed inside as a task that "needs the list of labels"; an unknown kind was a plain ValueError."""
    from lmforge.io import CheckpointError
    from lmforge.tasks.finetune import evaluate, finetune
    from lmforge.train import TrainConfig

    missing = tmp_path / "runs" / "nope"
    with pytest.raises(CheckpointError, match=f"^{missing} is neither a model directory nor a known model"):
        evaluate(missing, [{"text": "It is superb.", "label": "pos"}])
    with pytest.raises(OptionsError, match=r"kind is needed \(kind=; --task on the command line\): .* has no "
                                           r"task.json") as err:
        evaluate(model_dir, [{"text": "It is superb.", "label": "pos"}])
    assert err.value.field == "kind"
    out = tmp_path / "out"
    with pytest.raises(OptionsError, match=r"^train: no records \(an empty list\)") as err:
        finetune(model_dir, None, "cls", [], None, out, TrainConfig(steps=1))
    assert err.value.field == "train" and not out.exists()
    with pytest.raises(OptionsError, match=r"^task 'clss' is not one of cls, pair") as err:
        finetune(model_dir, None, "clss", [{"text": "a", "label": "x"}], None, out, TrainConfig(steps=1))
    assert err.value.field == "kind" and not out.exists()


@pytest.mark.parametrize("records, said", [([{"txt": "good"}], "^data:1: "),
                                           ([3], "^data:1: a record is a dict")])
def test_evaluate_refuses_a_bad_record_before_the_model_is_loaded(finetuned, monkeypatch, records, said):
    """evaluate checked each record only after fine_tuned_task had loaded the model: now by the kind the
    folder's task.json says (tasks.reference.saved_kind), first; the loader fails if it is reached."""
    import lmforge.tasks.finetune as finetune
    from lmforge.config.options import OptionsError

    monkeypatch.setattr(finetune, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    with pytest.raises(OptionsError, match=said):
        finetune.evaluate(finetuned, records)
