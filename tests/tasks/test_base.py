"""A Task names the outputs of the head it trains (head_labels), so a model fine-tuned in Python and saved
as Hugging Face right away carries its labels and problem_type, not LABEL_i."""
import json

import pytest

import lmforge
from lmforge.io.labels import HeadLabels
from lmforge.tasks.finetune import TaskConfig, finetune, make_task
from lmforge.train import TrainConfig
from tests.tasks.core import sentiment, tiny, tokenizer

LABELS = ["negative", "positive"]


def _task(kind: str, labels=None, model=None):
    model = model or tiny("bert-base", n_layers=1, n_heads=2)
    return make_task(kind, model, tokenizer(), [], TaskConfig(max_len=16), labels)


def test_a_python_fine_tuned_classifier_exports_its_labels(tmp_path):
    """lmforge.finetune on a model object, then lmforge.save(format="hf"): id2label was LABEL_0, LABEL_1."""
    transformers = pytest.importorskip("transformers")
    model = tiny("bert-base", n_layers=1, n_heads=2)
    train = [{**r, "label": LABELS[int(r["label"])]} for r in sentiment(40)["train"]]
    finetune(model, tokenizer(), "cls", train, None, tmp_path / "run",
             TrainConfig(steps=2, batch_size=8, seed=0, log_every=100), TaskConfig(max_len=16),
             log=lambda *a: None)
    lmforge.save(model, tmp_path / "hf", format="hf")
    config = transformers.AutoConfig.from_pretrained(tmp_path / "hf")
    assert config.id2label == {0: "negative", 1: "positive"}
    assert config.label2id == {"negative": 0, "positive": 1}
    assert "problem_type" not in json.loads((tmp_path / "hf" / "config.json").read_text())


@pytest.mark.parametrize("kind, labels, problem", [
    ("multilabel", ["a", "b", "c"], "multi_label_classification"), ("regression", None, "regression"),
    ("rerank", None, "regression")])
def test_a_task_says_the_problem_type_the_reference_would_misread(tmp_path, kind, labels, problem):
    """A multilabel head is no softmax, a one-output score no class: the export says so (and a reranker's
    that it is a CrossEncoder scored by sigmoid)."""
    transformers = pytest.importorskip("transformers")
    task = _task(kind, labels)
    activation = "sigmoid" if kind == "rerank" else None
    assert task.task_head.head_labels == HeadLabels(tuple(labels) if labels else None, problem, activation)
    lmforge.save(task.model, tmp_path / "hf", format="hf")
    config = transformers.AutoConfig.from_pretrained(tmp_path / "hf")
    assert config.problem_type == problem
    if labels:
        assert config.label2id == {name: i for i, name in enumerate(labels)}


def test_a_tagging_heads_tags_name_its_outputs(tmp_path):
    transformers = pytest.importorskip("transformers")
    task = _task("tagging", ["B-PER", "I-PER", "O"])
    lmforge.save(task.model, tmp_path / "hf", format="hf")
    config = transformers.AutoConfig.from_pretrained(tmp_path / "hf")
    assert config.id2label == {0: "B-PER", 1: "I-PER", 2: "O"} and config.problem_type is None


def test_a_new_task_on_the_head_renames_it_and_a_kept_head_keeps_a_loaded_problem_type():
    """A head kept (same shape) is named by the labels it is now trained on; a single-label problem_type
    it was loaded with stays, a multilabel one does not outlive a cls task."""
    task = _task("cls", LABELS)
    head = task.task_head
    head.head_labels = HeadLabels(("spam", "ham"), "single_label_classification")
    assert _task("cls", ["x", "y"], task.model).task_head.head_labels == HeadLabels(
        ("x", "y"), "single_label_classification")
    head.head_labels = HeadLabels(("x", "y"), "multi_label_classification")
    assert _task("cls", ["x", "y"], task.model).task_head.head_labels == HeadLabels(("x", "y"), None)


def test_a_loaded_regressors_score_name_is_kept():
    task = _task("regression")
    task.task_head.head_labels = HeadLabels(("similarity",), "regression")
    kept = _task("regression", None, task.model).task_head
    assert kept.head_labels == HeadLabels(("similarity",), "regression")


def test_a_head_without_labels_has_no_names():
    """A choice head's one output is no label: nothing is put on it (LABEL_0, as before)."""
    assert getattr(_task("choice").task_head, "head_labels", None) is None


def test_an_identity_cross_encoder_fine_tuned_as_regression_exports_its_activation_fn(tmp_path):
    """A CrossEncoder's Identity was lost on the way back (a regression exported one only when sigmoid), so
    sentence-transformers scored the export through a sigmoid; a plain identity regression exports none."""
    from tests.tasks.hf_reference import reference_dir

    identity = "torch.nn.modules.linear.Identity"
    _, path = reference_dir(tmp_path / "ce", num_labels=1, sentence_transformers={"activation_fn": identity})
    train = [{"text": "a good film", "text_pair": "a film", "label": 3.5}]
    cfg = TrainConfig(steps=1, batch_size=1, lr=1e-3, seed=0, log_every=100)
    finetune(path, None, "regression", train, None, tmp_path / "run", cfg, log=lambda *a: None)
    final = tmp_path / "run" / "final"
    lmforge.save(lmforge.load(final), tmp_path / "hf", format="hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["sentence_transformers"]["activation_fn"] == identity
    finetune(final, None, "regression", train, None, tmp_path / "again", cfg, log=lambda *a: None)
    lmforge.save(lmforge.load(tmp_path / "again" / "final"), tmp_path / "hf2", format="hf")
    assert json.loads((tmp_path / "hf2" / "config.json").read_text())["sentence_transformers"] == {
        "activation_fn": identity}
    plain = _task("regression")
    lmforge.save(plain.model, tmp_path / "plain", format="hf")
    assert "sentence_transformers" not in json.loads((tmp_path / "plain" / "config.json").read_text())


def test_a_max_len_past_the_models_positions_is_refused_not_cut_unsaid():
    """max_len=500 on a model of 128 positions trained and evaluated at 128 tokens, unsaid (task.json said
    128); the default (128) still reads to a shorter model's context."""
    from lmforge.config.options import OptionsError

    records = sentiment()["train"][:8]
    with pytest.raises(OptionsError, match=r"^max_len=500: more tokens than the model reads "
                                           r"\(max_seq_len=128\)$") as err:
        make_task("cls", tiny("bert-base", n_layers=1), tokenizer(), records, TaskConfig(max_len=500))
    assert err.value.field == "max_len"
    given = make_task("cls", tiny("bert-base", n_layers=1), tokenizer(), records, TaskConfig(max_len=128))
    assert given.max_len == 128
    short = lmforge.build(lmforge.tiny("bert-base", vocab_size=320, max_seq_len=64, n_layers=1))
    assert make_task("cls", short, tokenizer(), records, TaskConfig()).max_len == 64
