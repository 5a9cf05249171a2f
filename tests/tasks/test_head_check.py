"""A model folder that has no head of the task asked (tasks/reference.py check_head) is refused by what its
config.json says, before its weights are read: evaluate, and every job that rebuilds a fine-tuned task
(fine_tuned_task), had read a model of any size to refuse it after as "never fine-tuned"."""
import pytest

import lmforge.convert.hf
import lmforge.io.native
from lmforge.heads import attach
from lmforge.io import CheckpointError
from lmforge.tasks.finetune import evaluate, fine_tuned_task
from lmforge.tasks.reference import check_head, saved_heads
from tests.tasks.core import tiny, tokenizer

RECORDS = [{"text": "It is superb.", "label": "pos"}, {"text": "It broke.", "label": "neg"}]


@pytest.fixture
def no_weights_read(monkeypatch):
    """Reading any weights (lmforge's or a Hugging Face checkpoint's) fails the test."""
    def read(*args, **kwargs):
        raise AssertionError("the weights were read")

    monkeypatch.setattr(lmforge.io.native, "load_weights", read)
    monkeypatch.setattr(lmforge.convert.hf, "read_reference_weights", read)


def plain_folder(path, heads=()):
    """A tiny BERT (with `heads`, names of classification heads) and its tokenizer, no task.json."""
    model = tiny("bert-base")
    for name in heads:
        attach(model, name, n_labels=2)
    model.save(path)
    tokenizer("bert").save(path)
    return path


@pytest.mark.parametrize("kind", ["cls", "rerank", "tagging", "qa"])
def test_a_backbone_never_fine_tuned_is_refused_naming_its_config_before_the_weights(
        tmp_path, no_weights_read, kind):
    folder = plain_folder(tmp_path / "plain")
    with pytest.raises(CheckpointError, match=f"^{folder} was never fine-tuned for {kind}: its config.json "
                                              "has no ") as refused:
        fine_tuned_task(folder, RECORDS, kind)
    assert "\n" not in str(refused.value)


def test_evaluate_refuses_it_before_the_weights_too(tmp_path, no_weights_read):
    folder = plain_folder(tmp_path / "plain")
    with pytest.raises(CheckpointError, match="never fine-tuned for cls: its config.json has no classif"):
        evaluate(folder, RECORDS, "cls")


def test_a_hugging_face_model_without_a_task_head_is_refused_before_its_weights(tmp_path, no_weights_read):
    pytest.importorskip("transformers")
    from tests.tasks.hf_reference import reference_dir

    for architecture, kind in (("BertModel", "cls"), ("BertForMaskedLM", "rerank")):
        _, folder = reference_dir(tmp_path / architecture, architecture)
        with pytest.raises(CheckpointError, match=f"{architecture} was never fine-tuned for {kind}"):
            fine_tuned_task(folder, RECORDS, kind)


def test_a_folder_with_the_head_or_no_folder_at_all_passes_the_check(tmp_path):
    """The check refuses only what the load would refuse: a head of the task's name saved without
    task.json is the load's to judge (its spec), and a preset or model object has no config.json."""
    folder = plain_folder(tmp_path / "headed", heads=("classification",))
    assert saved_heads(folder) == {"classification"}
    assert check_head(folder, {}, "cls", str(folder)) is None
    assert check_head(None, {}, "cls", "the model") is None and saved_heads(tmp_path / "none") is None
    bare = plain_folder(tmp_path / "bare")
    assert check_head(bare, {}, "seq2seq", str(bare)) is None  # a task of the LM head: not checked
    assert fine_tuned_task(folder, RECORDS, "cls").kind == "cls"  # it still loads


def test_a_task_json_beside_a_model_without_its_head_names_both_files(tmp_path, no_weights_read):
    import json

    folder = plain_folder(tmp_path / "odd")
    (folder / "task.json").write_text(json.dumps({"kind": "cls", "labels": ["neg", "pos"]}))
    want = f"{folder / 'config.json'} gives the model no classification head, where its task.json says cls"
    with pytest.raises(CheckpointError, match=f"^{want}$"):
        fine_tuned_task(folder, RECORDS)


def test_an_encoder_decoder_without_a_classifier_is_left_to_read_text_to_text(tmp_path):
    """A T5 has no classification head: cls reads it text-to-text by its LM head (text2text.choose), as a
    prune of a saved T5 classifier does; the check had refused it."""
    folder = tmp_path / "t5"
    tiny("t5-small").save(folder)
    tokenizer("t5").save(folder)
    assert "classification" not in saved_heads(folder)
    assert check_head(folder, {}, "cls", str(folder)) is None
    assert fine_tuned_task(folder, RECORDS, "cls").head == "lm"
