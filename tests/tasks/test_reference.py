"""Hugging Face fine-tuned checkpoints: their head's meaning (problem_type, num_labels, id2label) is read
as the reference reads it, with its predictions, or refused naming the field."""
import json
from pathlib import Path

import pytest
import torch

from lmforge.tasks.finetune import evaluate, task_info
from tests.tasks.core import tokenizer
from tests.tasks.hf_reference import TEXTS, predictions, reference_dir, reference_logits

transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize("config, field", [({"problem_type": "regression", "num_labels": 1}, "problem_type"),
                                           ({"num_labels": 1}, "num_labels")])
def test_a_one_output_classifier_is_read_as_its_raw_score_never_as_a_one_label_class(tmp_path, config, field):
    model, path = reference_dir(tmp_path / "m", **config)
    want = [float(logits[0]) for logits in reference_logits(model)]
    assert predictions(path, "regression", tmp_path) == pytest.approx(want, abs=1e-5)
    with pytest.raises(ValueError,
                       match=f"config.json's {field} .* is not a cls task; it is read as regression"):
        predictions(path, "cls", tmp_path)


@pytest.mark.parametrize("config, field", [
    ({"problem_type": "regression", "num_labels": 2}, "problem_type 'regression' with num_labels 2")])
@pytest.mark.parametrize("kind", ["cls", "regression", "multilabel"])
def test_a_head_whose_meaning_lmforge_lacks_is_refused_for_every_task_naming_the_field(
        tmp_path, config, field, kind):
    _, path = reference_dir(tmp_path / "m", **config)
    task_info(path)  # the directory itself is readable (installed, quantized): only its task use is refused
    with pytest.raises(ValueError, match=f"config.json's {field}") as err:
        predictions(path, kind, tmp_path)
    assert "\n" not in str(err.value)


def test_a_classifier_predicts_the_reference_argmax_named_by_id2label_whatever_label2id_says(tmp_path):
    labels = {0: 7, 1: "neutral", 2: 3}  # numbers as labels; label2id below disagrees: id2label names outputs
    model, path = reference_dir(tmp_path / "m", id2label=labels, label2id={"7": 2, "neutral": 0, "3": 1})
    want = [labels[int(logits.argmax())] for logits in reference_logits(model)]
    assert predictions(path, "cls", tmp_path) == want
    with pytest.raises(ValueError, match="config.json's num_labels 3 .* is not a regression task"):
        predictions(path, "regression", tmp_path)


def test_a_multi_label_classifier_is_read_as_multilabel_with_the_reference_logits_and_id2label(tmp_path):
    from lmforge.tasks.finetune import fine_tuned_task

    labels = {0: "sports", 1: "politics", 2: "art"}
    model, path = reference_dir(tmp_path / "m", problem_type="multi_label_classification", id2label=labels)
    logits = reference_logits(model)
    task = fine_tuned_task(path, [], "multilabel")
    assert task.labels == ["sports", "politics", "art"]
    ours = [task.scores(task.collate(task.encode({"text": t}))).detach()[0] for t in TEXTS]
    torch.testing.assert_close(torch.stack(ours), torch.stack(logits), atol=1e-5, rtol=1e-4)
    want = [[labels[i] for i in range(3) if torch.sigmoid(row[i]) > 0.5] for row in logits]
    assert predictions(path, "multilabel", tmp_path) == want
    with pytest.raises(ValueError, match="'multi_label_classification' .* is not a cls task; it is read as "
                                         "multilabel"):
        predictions(path, "cls", tmp_path)


def test_a_multilabel_model_converts_to_a_reference_multi_label_classifier_with_equal_logits(tmp_path):
    from lmforge.cli import main
    from lmforge.tasks import task_class
    from lmforge.tasks.finetune import save_model
    from tests.tasks.core import tiny

    task = task_class("multilabel")(tiny(n_layers=2, n_heads=2), tokenizer(), labels=["x", "y", "z"]).eval()
    save_model(task, tmp_path / "ours")
    assert main(["convert", str(tmp_path / "ours"), str(tmp_path / "hf"), "--to", "hf"]) == 0
    ref = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "hf").eval()
    assert ref.config.problem_type == "multi_label_classification"
    assert ref.config.id2label == {0: "x", 1: "y", 2: "z"}
    gold = [["x", "z"], [], ["y"], ["x", "y", "z"]]
    batch = task.collate(task.encode_all([{"text": t, "label": g} for t, g in zip(TEXTS, gold)]))
    with torch.no_grad():
        theirs = ref(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                     token_type_ids=batch["segment_ids"], labels=batch["label"])
        torch.testing.assert_close(task.scores(batch), theirs.logits, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(task(batch).loss, theirs.loss, atol=1e-5, rtol=1e-4)
    assert task_info(tmp_path / "hf")["kind"] == "multilabel"  # task.json travels with it


def test_a_fine_tuned_folder_whose_task_json_kind_is_null_is_refused_naming_the_file_not_as_no_task(tmp_path):
    """A task.json with "kind": null was read as no task.json: "the task kind is needed ... has no
    task.json" (an OptionsError about the caller's kind), where the folder's own file is damaged."""
    from lmforge.io import CheckpointError
    from lmforge.tasks.finetune import fine_tuned_task, save_model
    from lmforge.tasks.base import task_class
    from lmforge.utils.model_folder import record_sums
    from tests.tasks.core import tiny

    path = save_model(task_class("cls")(tiny(), tokenizer(), labels=["neg", "pos"], max_len=64),
                      tmp_path / "m")
    info = json.loads((path / "task.json").read_text())
    (path / "task.json").write_text(json.dumps({**info, "kind": None}))
    record_sums(path, ["task.json"])  # damaged by its writer, not since: the checksum agrees
    for read in (lambda: task_info(path), lambda: fine_tuned_task(path, [{"text": "a", "label": "neg"}])):
        with pytest.raises(CheckpointError, match=rf'^{path / "task.json"}: "kind" is null'):
            read()


def test_id2label_keys_that_skip_an_output_are_refused_naming_id2label(tmp_path):
    _, path = reference_dir(tmp_path / "m", id2label={0: "neg", 2: "pos"})
    with pytest.raises(ValueError,
                       match=r"config.json: id2label keys must be the outputs 0..1, got \[0, 2\]"):
        task_info(path)


def test_a_token_classifier_is_never_read_as_a_sequence_classifier(tmp_path):
    _, path = reference_dir(tmp_path / "m", "BertForTokenClassification", id2label={0: "O", 1: "B"})
    assert task_info(path)["labels"] == ["O", "B"]
    with pytest.raises(ValueError,
                       match="config.json's architectures 'BertForTokenClassification' is not a cls"):
        predictions(path, "cls", tmp_path)


def test_a_token_classifier_without_id2label_does_not_name_its_outputs_by_the_records_tags(tmp_path):
    _, path = reference_dir(tmp_path / "m", "BertForTokenClassification", num_labels=2)
    without_id2label(path, 2)
    with pytest.raises(ValueError,
                       match="config.json has no id2label, so its 2 outputs are the class ids 0..1"):
        evaluate(path, [{"words": ["a", "good", "film"], "tags": ["O", "B", "O"]}], "tagging")


def without_id2label(path, n):
    """The config.json as transformers 5 saves default labels: num_labels, no id2label / label2id."""
    config = json.loads((path / "config.json").read_text())
    config.pop("id2label", None), config.pop("label2id", None)
    (path / "config.json").write_text(json.dumps({**config, "num_labels": n}))


def test_a_classifier_without_id2label_predicts_its_class_ids_in_output_order(tmp_path):
    model, path = reference_dir(tmp_path / "m", num_labels=12)
    without_id2label(path, 12)
    want = [str(int(logits.argmax())) for logits in reference_logits(model)]
    out = tmp_path / "predictions.jsonl"  # class ids as a dataset gives them: 0..11, "10" after "9"
    evaluate(path, [{"text": t, "label": i} for i, t in enumerate(TEXTS)], "cls", out=out)
    assert [json.loads(line)["prediction"] for line in out.read_text().splitlines()] == want
    with pytest.raises(ValueError,
                       match="config.json has no id2label, so its 12 outputs are the class ids 0..11"):
        evaluate(path, [{"text": t, "label": "pos"} for t in TEXTS], "cls")


@pytest.mark.parametrize("hf, want", [
    ({"architectures": ["BertForSequenceClassification"], "problem_type": "multi_label_classification",
      "id2label": {"1": "y", "0": "x"}},
     {"kind": "multilabel", "labels": ["x", "y"], "problem_type": "multi_label_classification",
      "max_len": 8}),
    ({"architectures": ["BertForTokenClassification"], "num_labels": 3},
     {"kind": "tagging", "outputs": 3, "problem_type": None, "max_len": 8}),
    ({"architectures": ["BertForQuestionAnswering"]}, {"kind": "qa", "max_len": 8}),
    ({"architectures": ["BertForMaskedLM"], "id2label": {"0": "LABEL_0"}}, None),
    ({"architectures": ["BertModel"]}, None)])
def test_task_file_records_the_kind_a_reference_config_decides(hf, want):
    """The task.json a fine-tuned model of the head has; none for a head that is no task's."""
    from lmforge.tasks.reference import task_file

    assert task_file(Path("config.json"), hf, 8) == want


def test_task_file_leaves_the_kind_to_the_data_where_the_config_does_not_decide():
    """A single-label classifier is cls or pair, one score regression or rerank: the records say which."""
    from lmforge.tasks.reference import task_file

    classifier = {"architectures": ["BertForSequenceClassification"]}
    for hf, kinds in (({**classifier, "num_labels": 3}, ["cls", "pair"]),
                      ({**classifier, "problem_type": "regression", "id2label": {"0": "score"}},
                       ["regression", "rerank"])):
        info = task_file(Path("config.json"), hf, 8)
        assert "kind" not in info and info["kinds"] == kinds and info["why"].startswith("config.json's")


def test_a_language_model_s_config_states_no_task_whatever_its_id2label(tmp_path):
    """task_file read a language model's id2label before knowing it had no task head: an odd one refused
    its conversion."""
    from lmforge.tasks.reference import task_file

    hf = {"architectures": ["GPT2LMHeadModel"], "id2label": {"5": "x"}, "model_type": "gpt2"}
    assert task_file(tmp_path / "config.json", hf, 1024) is None


def test_one_test_says_whether_a_folder_was_fine_tuned_for_a_kind():
    """fine_tuned_for is the one reading (checkpoint_defaults, prune, check_kind): a task.json's kind or a
    reference head's kinds; check_kind refuses exactly where it is false and the folder names a kind."""
    from lmforge.tasks.reference import check_kind, fine_tuned_for

    infos = [{"kind": "cls"}, {"kinds": ["rerank", "regression"], "why": "one output"},
             {"kinds": [], "why": "three raw scores"}, {}, {"labels": ["a"]}]
    for info in infos:
        for kind in ("cls", "pair", "regression", "rerank"):
            says = "kind" in info or "kinds" in info
            if fine_tuned_for(info, kind) or not says:
                check_kind("m", info, kind)  # no refusal
            else:
                with pytest.raises(ValueError, match=r"^m(:| was fine-tuned for cls, not)"):
                    check_kind("m", info, kind)
    assert fine_tuned_for({"kind": "cls"}, "cls") and not fine_tuned_for({"kind": "cls"}, "pair")
    assert fine_tuned_for({"kinds": ["rerank", "regression"]}, "regression") and not fine_tuned_for({}, "cls")
