"""A classifier saved as Hugging Face names its outputs as lmforge knows them (task.json, a reference
config's id2label, or labels= given), as `lmforge convert --to hf` does; the reference reads them."""
import json

import pytest

import lmforge
from lmforge.io import CheckpointError
from lmforge.io.labels import HeadLabels, read_labels
from lmforge.utils.model_folder import record_sums

LABELS = ["negative", "neutral", "positive"]


def _classifier(n: int = 3):
    model = lmforge.build(lmforge.tiny("bert-base"))
    lmforge.heads.attach(model, "classification", n_labels=n)
    return model


def _fine_tuned(folder, task: dict):
    """An lmforge model folder as fine-tuning leaves it: the model and its task.json, checksummed."""
    _classifier(len(task.get("labels") or [0])).save(folder)
    (folder / "task.json").write_text(json.dumps(task))
    record_sums(folder, ["task.json"])
    return folder


def _hf_config(folder) -> dict:
    return json.loads((folder / "config.json").read_text())


def test_a_fine_tuned_models_labels_reach_the_reference_config(tmp_path):
    """lmforge.load(d).save(out, format="hf") wrote LABEL_0..LABEL_2 where task.json named them."""
    transformers = pytest.importorskip("transformers")
    src = _fine_tuned(tmp_path / "ft", {"kind": "cls", "labels": LABELS, "max_len": 16})
    lmforge.save(lmforge.load(src), tmp_path / "hf", format="hf")
    hf = _hf_config(tmp_path / "hf")
    assert hf["id2label"] == {"0": "negative", "1": "neutral", "2": "positive"}
    assert hf["label2id"] == {"negative": 0, "neutral": 1, "positive": 2}
    assert "problem_type" not in hf  # a single-label classifier: the reference's default
    config = transformers.AutoConfig.from_pretrained(tmp_path / "hf")
    assert config.id2label == {0: "negative", 1: "neutral", 2: "positive"} and config.num_labels == 3


def test_a_multilabel_task_says_its_problem_type_to_the_reference(tmp_path):
    """Without problem_type the reference reads a multilabel head as one softmax."""
    transformers = pytest.importorskip("transformers")
    src = _fine_tuned(tmp_path / "ft", {"kind": "multilabel", "labels": ["a", "b"], "max_len": 16})
    lmforge.load(src).save(tmp_path / "hf", format="hf")
    config = transformers.AutoConfig.from_pretrained(tmp_path / "hf")
    assert config.problem_type == "multi_label_classification" and config.label2id == {"a": 0, "b": 1}


def test_a_reference_classifiers_labels_survive_a_round_trip(tmp_path):
    """A Hugging Face classifier read and written again keeps its id2label and problem_type."""
    _classifier(2).save(tmp_path / "one", format="hf")
    config = _hf_config(tmp_path / "one")
    config.update(id2label={"0": "spam", "1": "ham"}, problem_type="single_label_classification")
    (tmp_path / "one" / "config.json").write_text(json.dumps(config))
    lmforge.load(tmp_path / "one").save(tmp_path / "two", format="hf")
    hf = _hf_config(tmp_path / "two")
    assert hf["id2label"] == {"0": "spam", "1": "ham"} and hf["problem_type"] == "single_label_classification"


def test_labels_given_name_the_outputs_of_a_model_that_cannot_know_them(tmp_path):
    transformers = pytest.importorskip("transformers")
    lmforge.save(_classifier(), tmp_path / "hf", format="hf", labels=LABELS)
    config = transformers.AutoConfig.from_pretrained(tmp_path / "hf")
    assert list(config.id2label.values()) == LABELS and config.label2id["positive"] == 2


def test_a_head_put_in_place_of_the_loaded_one_is_not_named_by_its_labels(tmp_path):
    """Fine-tuning on other labels makes a fresh head of the same size: the old names would be wrong."""
    src = _fine_tuned(tmp_path / "ft", {"kind": "cls", "labels": LABELS, "max_len": 16})
    model = lmforge.load(src)
    name = next(iter(model.heads))
    model.heads[name] = lmforge.heads.make_head(model, "classification", n_labels=3)
    model.save(tmp_path / "hf", format="hf")
    assert _hf_config(tmp_path / "hf")["id2label"]["0"] == "LABEL_0"


def test_without_labels_known_the_outputs_stay_label_i(tmp_path):
    lmforge.save(_classifier(), tmp_path / "hf", format="hf")
    hf = _hf_config(tmp_path / "hf")
    assert hf["id2label"] == {"0": "LABEL_0", "1": "LABEL_1", "2": "LABEL_2"} and "label2id" not in hf


@pytest.mark.parametrize("labels, match", [
    (["a", "b"], "2 given, but the model has a classifier head of 3 outputs"),
    (["a", "a", "b"], "must be unique"),
    (["a", 1, "b"], "non-empty strings"),
    ("abc", "must be a list"),
])
def test_labels_that_do_not_fit_the_head_are_refused_naming_the_field(tmp_path, labels, match):
    with pytest.raises(lmforge.OptionsError, match=match) as refused:
        lmforge.save(_classifier(), tmp_path / "hf", format="hf", labels=labels)
    assert refused.value.field == "labels" and "\n" not in str(refused.value)
    assert not (tmp_path / "hf" / "config.json").exists()


def test_labels_for_a_model_without_a_classifier_or_in_lmforges_format_are_refused(tmp_path):
    with pytest.raises(lmforge.OptionsError, match="no classifier head"):
        lmforge.save(lmforge.build(lmforge.tiny("bert-base")), tmp_path / "a", format="hf", labels=["x"])
    with pytest.raises(lmforge.OptionsError, match="format=\"hf\" only"):
        lmforge.save(_classifier(), tmp_path / "b", labels=LABELS)


def test_a_damaged_task_json_is_refused_when_its_labels_are_written_not_when_loaded(tmp_path):
    """A model loaded to embed is not refused for its task.json; an export that would name its outputs is."""
    src = _fine_tuned(tmp_path / "ft", {"kind": "cls", "labels": {"x": 1}, "max_len": 16})
    model = lmforge.load(src)
    with pytest.raises(CheckpointError, match="task.json: \"labels\" must be a list") as refused:
        model.save(tmp_path / "hf", format="hf")
    assert "\n" not in str(refused.value)


def test_read_labels_takes_a_converted_checkpoints_regressor_name_and_problem_type(tmp_path):
    src = _fine_tuned(tmp_path / "ft", {"kind": "regression", "id2label": ["score"], "problem_type": None})
    assert read_labels(src, json.loads((src / "config.json").read_text())) == HeadLabels(("score",), None)


def test_the_label_tables_have_one_home_and_are_imported_from_it():
    """io/labels.py held a kind -> problem_type table and tasks/reference.py the valid problem_types, both
    named PROBLEM_TYPES; is_label and the id2label order were written twice. One home now, read by both,
    and no module takes them from tasks/reference.py (whose comment said some did)."""
    import re
    from pathlib import Path

    from lmforge.io import labels
    from lmforge.tasks import base, reference

    assert labels.PROBLEM_TYPES == ("regression", "single_label_classification", "multi_label_classification")
    assert set(labels.KIND_PROBLEM_TYPE.values()) <= set(labels.PROBLEM_TYPES)
    assert reference.PROBLEM_TYPES is labels.PROBLEM_TYPES and reference.is_label is labels.is_label
    assert base.KIND_PROBLEM_TYPE is labels.KIND_PROBLEM_TYPE
    names = r"\b(PROBLEM_TYPES|is_label|ACTIVATIONS)\b"
    helpers = re.compile(r"from lmforge\.tasks\.reference import \(?[^)]*?" + names)
    src = Path(labels.__file__).resolve().parents[1]
    assert [p.name for p in src.rglob("*.py") if helpers.search(p.read_text())] == []


@pytest.mark.parametrize("id2label, match", [
    ({"0": "a", "2": "b"}, r"keys must be the outputs 0..1, got \[0, 2\]"),
    ({"x": "a"}, "keys must be label numbers"), ({"0": ["a"]}, "values must be label names")])
def test_an_id2label_is_read_one_way_by_load_and_by_the_task_reader(tmp_path, id2label, match):
    from lmforge.tasks.reference import reference_task

    config = {"architectures": ["BertForSequenceClassification"], "id2label": id2label}
    with pytest.raises(CheckpointError, match=f"config.json: id2label {match}"):
        read_labels(tmp_path, config)
    with pytest.raises(ValueError, match=f"config.json: id2label {match}"):
        reference_task(tmp_path / "config.json", config)
    assert read_labels(tmp_path, {"id2label": {"1": 7, "0": "x"}}).names == ("x", "7")  # output order


@pytest.mark.parametrize("field, value", [("kinds", 5), ("kinds", ["rerank", 3]), ("kind", ["cls"])])
def test_a_malformed_kind_in_task_json_beside_a_reference_config_is_a_typed_error(tmp_path, field, value):
    """A task.json whose "kinds" was a number, beside a Hugging Face config.json with no checksum recorded,
    gave a raw TypeError on load; it is kept as load keeps damaged labels (a CheckpointError naming
    task.json, raised where the labels are exported) and task_info refuses it naming the same file."""
    from lmforge.tasks.reference import task_info

    lmforge.save(_classifier(2), tmp_path / "hf", format="hf")
    (tmp_path / "hf" / "task.json").write_text(json.dumps({field: value}))
    model = lmforge.load(tmp_path / "hf")  # loaded to embed: not refused, as with damaged labels
    with pytest.raises(CheckpointError, match=f"task.json: \"{field}\" must be a") as refused:
        model.save(tmp_path / "out", format="hf")
    assert "\n" not in str(refused.value)
    with pytest.raises(ValueError, match=f"task.json: \"{field}\""):
        task_info(tmp_path / "hf")


@pytest.mark.parametrize("task, said", [({"kind": None, "labels": ["a", "b"]}, "null"),
                                         ({"labels": ["a", "b"]}, "missing")])
def test_a_task_json_whose_kind_is_null_or_missing_is_refused_naming_kind_and_the_file(tmp_path, task, said):
    """"kind": null passed every check as if unsaid, and fine-tuning's reader then said the folder "has no
    task.json"; every writer names a kind (or a reference head's kinds), so either is a damaged file."""
    from lmforge.tasks.reference import task_info

    src = _fine_tuned(tmp_path / "ft", {**task, "max_len": 16})
    model = lmforge.load(src)  # loaded to embed: not refused, as with damaged labels
    want = rf'^{src / "task.json"}: "kind" is {said}: a task.json names its task kind'
    with pytest.raises(CheckpointError, match=want):
        model.save(tmp_path / "hf", format="hf")
    with pytest.raises(CheckpointError, match=want):
        task_info(src)


@pytest.mark.parametrize("block", [{"version": "4.1.0"}, {"activation_fn": None, "version": "4.1.0"}])
@pytest.mark.parametrize("config, want", [({"num_labels": 1}, "sigmoid"), ({"num_labels": 3}, "identity"),
                                          ({"id2label": {"0": "x"}, "num_labels": 2}, "sigmoid")])
def test_a_cross_encoder_naming_no_activation_takes_sentence_transformers_default(block, config, want):
    """A sentence_transformers block without an activation_fn (or a null one) is a CrossEncoder's whose
    activation is CrossEncoder's default: sigmoid for one label, identity for more (lmforge read no
    CrossEncoder, so its own default, or a sigmoid whatever the number of labels)."""
    from lmforge.io.labels import cross_encoder, cross_encoder_activation

    hf = {"architectures": ["BertForSequenceClassification"], **config, "sentence_transformers": block}
    assert cross_encoder(hf) and cross_encoder_activation("config.json", hf) == want


def _cross_encoder_folder(folder, n: int):
    """A tiny BERT classifier of `n` labels whose config.json has, written by hand, a sentence_transformers
    block without its activation_fn; a WordPiece vocab.txt both libraries read alike."""
    import torch
    transformers = pytest.importorskip("transformers")
    from tests.pipelines.test_embed import VOCAB

    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification(transformers.BertConfig(
        vocab_size=len(VOCAB), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, num_labels=n))
    with torch.no_grad():
        model.classifier.weight.mul_(50)  # logits away from 0, where sigmoid and identity part
    model.eval().save_pretrained(folder)
    config = _hf_config(folder)
    config["sentence_transformers"] = {"version": "4.1.0"}
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    return folder


def test_a_one_label_cross_encoder_without_activation_fn_scores_as_cross_encoder_predict(tmp_path):
    """Its regression scores are the logits' sigmoid, as CrossEncoder.predict gives them (they were raw)."""
    from lmforge.tasks.finetune import evaluate, fine_tuned_task
    from tests.pipelines.test_rerank import DOCS, QUERY

    path = _cross_encoder_folder(tmp_path / "ce", 1)
    assert fine_tuned_task(path, [], "regression").activation == "sigmoid"
    out = tmp_path / "predictions.jsonl"
    evaluate(path, [{"text": QUERY, "text_pair": d} for d in DOCS], "regression", out=out)
    ours = [json.loads(line)["prediction"] for line in out.read_text().splitlines()]
    assert all(0 < score < 1 for score in ours)
    st = pytest.importorskip("sentence_transformers")
    theirs = st.CrossEncoder(str(path), device="cpu").predict([(QUERY, d) for d in DOCS])
    assert ours == pytest.approx(theirs.tolist(), abs=1e-5)


def test_a_cross_encoder_of_several_labels_without_activation_fn_exports_its_identity(tmp_path):
    """lmforge read a sigmoid and wrote it as the export's activation_fn: sentence-transformers then scored
    the export through a sigmoid where it had scored the source's raw logits."""
    path = _cross_encoder_folder(tmp_path / "ce", 3)
    assert read_labels(path, _hf_config(path)).activation == "identity"
    lmforge.save(lmforge.load(path), tmp_path / "hf", format="hf")
    assert _hf_config(tmp_path / "hf")["sentence_transformers"] == {
        "activation_fn": "torch.nn.modules.linear.Identity"}
    st = pytest.importorskip("sentence_transformers")
    # its tokenizer, as it came
    (tmp_path / "hf" / "vocab.txt").write_bytes((path / "vocab.txt").read_bytes())
    pairs = [("a good film", "it is superb ."), ("a good film", "the plot is dull")]
    source, export = (st.CrossEncoder(str(p), device="cpu") for p in (path, tmp_path / "hf"))
    assert type(export.activation_fn) is type(source.activation_fn)
    assert export.predict(pairs) == pytest.approx(source.predict(pairs), abs=1e-5)


@pytest.mark.parametrize("num_labels", ["3", 3.0, True, 0, -1])
def test_a_num_labels_that_is_no_positive_integer_is_refused_naming_it(num_labels):
    from lmforge.config import ConfigError
    from lmforge.io.labels import n_labels

    assert n_labels({"id2label": {"0": "a", "1": "b", "2": "c"}, "num_labels": num_labels}) == 3
    with pytest.raises(ConfigError, match="num_labels must be a positive integer") as err:
        n_labels({"num_labels": num_labels})
    assert err.value.field == "num_labels"
    assert n_labels({}) == n_labels({"num_labels": None}) == 2 and n_labels({"num_labels": 1}) == 1
