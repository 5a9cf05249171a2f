"""The served model's description (/info): its parameters counted as `lmforge inspect` counts them."""
from __future__ import annotations

import torch

import lmforge
from lmforge.compress.quantize import quantize
from lmforge.heads import attach
from lmforge.pipelines.summary import parameter_counts
from lmforge.serve.models import load_served
from lmforge.tokenizer import train_tokenizer

TEXTS = [f"the {a} {b} sat on the {c}" for a in ("small", "red", "old") for b in ("cat", "dog")
         for c in ("mat", "hill")]


def test_info_counts_an_int8_model_as_inspect_does_heads_excluded(tmp_path):
    tokenizer = train_tokenizer(TEXTS, "wordpiece", 120, family="bert")
    torch.manual_seed(0)
    model = lmforge.build(lmforge.tiny("bert-base", vocab_size=tokenizer.vocab_size)).eval()
    attach(model, "classification", n_labels=2)
    backbone = model.num_parameters()  # fp32: heads excluded
    for name, m in (("fp32", model), ("int8", quantize(model))):
        m.save(tmp_path / name)
        tokenizer.save(tmp_path / name)
        info = load_served(name, tmp_path / name).describe()
        loaded = lmforge.load(tmp_path / name)
        assert info["parameters"] == backbone == parameter_counts(loaded)["total"], name  # inspect's total
        assert "heads excluded" in info["parameters_counted"]


def test_a_hugging_face_classifier_is_served_for_predict_as_its_config_says(tmp_path):
    """A directory without task.json had no predict capability (text-embeddings-inference serves such
    classifiers): its task is now read from config.json as the reference reads it (tasks/reference.py)."""
    import pytest

    transformers = pytest.importorskip("transformers")
    tokenizer = train_tokenizer(TEXTS, "wordpiece", 120, family="bert")
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=64, num_labels=3,
                                     id2label={0: "neg", 1: "neutral", 2: "pos"})
    reference = transformers.BertForSequenceClassification(config).eval()
    for name, kind in (("cls", "cls"), ("sts", "regression")):
        if kind == "regression":
            config = transformers.BertConfig(**{**config.to_dict(), "num_labels": 1, "id2label": None,
                                                "label2id": None, "problem_type": "regression"})
            reference = transformers.BertForSequenceClassification(config).eval()
        reference.save_pretrained(tmp_path / name)
        tokenizer.save(tmp_path / name)
        served = load_served(name, tmp_path / name)
        assert served.task.kind == kind and "predict" in served.capabilities
        examples = served.task.encode_all([{"text": text} for text in TEXTS[:4]])
        outputs = served.task.outputs(examples)
        ids = [list(example["input_ids"]) for example in examples]
        with torch.no_grad():
            want = [reference(torch.tensor([i])).logits[0] for i in ids]
        if kind == "cls":  # the task's outputs are the label probabilities
            want = [logits.softmax(-1) for logits in want]
        for got, logits in zip(outputs, want):
            torch.testing.assert_close(torch.as_tensor(got).float().reshape(-1), logits, rtol=1e-4, atol=1e-4)
    assert load_served("cls", tmp_path / "cls").task.labels == ["neg", "neutral", "pos"]


def test_a_multi_label_classifier_is_served_for_predict_with_its_true_labels_and_each_label_score(tmp_path):
    import pytest

    from lmforge.serve.job_kinds import describe
    from lmforge.serve.records import as_records
    from lmforge.serve.schemas import Prediction

    transformers = pytest.importorskip("transformers")
    tokenizer = train_tokenizer(TEXTS, "wordpiece", 120, family="bert")
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=64, id2label={0: "a", 1: "b"},
                                     problem_type="multi_label_classification")
    transformers.BertForSequenceClassification(config).save_pretrained(tmp_path)
    tokenizer.save(tmp_path)
    task = load_served("m", tmp_path).task
    records = as_records("multilabel", [TEXTS[0], {"text": TEXTS[1], "text_pair": TEXTS[2]}])
    examples = task.encode_all(records)
    outputs = task.outputs(examples)
    for record, prediction, example, output in zip(records, task.decode(records, examples, outputs),
                                                   examples, outputs):
        found = Prediction(**describe(task, record, prediction, [example], [output]))
        found = found.model_dump(exclude_none=True)
        assert set(found) == {"labels", "scores"} and list(found["scores"]) == ["a", "b"]
        assert found["labels"] == [k for k, p in found["scores"].items() if p > 0.5]


def test_a_fine_tuned_seq2seq_model_is_served_with_its_task_json_options(tmp_path):
    """A seq2seq task.json holds prefix among the task's own options: the server's rebuild passed prefix twice
    (TypeError), so no seq2seq model could be served; it now reads them as evaluate does."""
    from lmforge.tasks.finetune import TaskConfig, make_task, save_model

    tokenizer = train_tokenizer(TEXTS, "unigram", 120, family="t5")
    torch.manual_seed(0)
    model = lmforge.build(lmforge.tiny("t5-small", vocab_size=tokenizer.vocab_size)).eval()
    attach(model, "lm")
    config = TaskConfig(max_len=32, prefix="summarize", num_beams=2, max_new_tokens=5)
    save_model(make_task("seq2seq", model, tokenizer, [], config), tmp_path)
    served = load_served("s2s", tmp_path)
    assert "predict" in served.capabilities and served.task.kind == "seq2seq"
    assert (served.task.prefix, served.task.num_beams, served.task.max_new_tokens) == ("summarize", 2, 5)


def test_a_served_cross_encoder_regression_reads_its_score_through_the_activation_as_evaluate_does(tmp_path):
    """rebuild_task built a served regression without the CrossEncoder's activation (only fine_tuned_task set
    it, after make_task): the server gave the raw logit where evaluate gave its sigmoid. The activation is
    a task option now, read from the folder once (task_info), so both routes build the same task."""
    import json

    import pytest

    from lmforge.tasks.finetune import fine_tuned_task
    from tests.tasks.hf_reference import TEXTS, reference_dir

    sigmoid = {"activation_fn": "torch.nn.modules.activation.Sigmoid"}
    model, path = reference_dir(tmp_path / "ce", num_labels=1, sentence_transformers=sigmoid)
    (path / "task.json").write_text(json.dumps({"kind": "regression"}))  # served for predict, not rerank
    records = [{"text": a, "text_pair": b} for a, b in zip(TEXTS, TEXTS[1:])]
    served, evaluated = load_served("ce", path).task, fine_tuned_task(path, records).eval()
    assert served.kind == "regression" and served.activation == evaluated.activation == "sigmoid"
    got = served.outputs(served.encode_all(records))
    with torch.no_grad():
        want = [float(model(torch.tensor([e["input_ids"]]), token_type_ids=torch.tensor([e["segment_ids"]]))
                      .logits[0, 0].sigmoid()) for e in served.encode_all(records)]
    assert got == pytest.approx(want, abs=1e-5) == evaluated.outputs(evaluated.encode_all(records))


def test_a_cross_encoder_it_cannot_score_with_is_refused_before_its_weights_are_read(tmp_path, capsys):
    """load_served read the whole model before saved_options refused a CrossEncoder's Tanh: it refuses it
    first now, by fine_tuned_task's check (check_scored), so junk weights still get the activation's error,
    and `lmforge serve` exits 2 with it in one line, as for any model it cannot serve."""
    import re

    import pytest

    pytest.importorskip("transformers")
    from lmforge.cli import main
    from tests.tasks.hf_reference import reference_dir

    tanh = "torch.nn.modules.activation.Tanh"
    _, path = reference_dir(tmp_path / "ce", num_labels=1, sentence_transformers={"activation_fn": tanh})
    (path / "model.safetensors").write_bytes(b"not weights")  # any read of the weights fails
    refusal = f"{path / 'config.json'}: activation_fn '{tanh}' is not supported"
    with pytest.raises(ValueError, match=f"^{re.escape(refusal)}"):
        load_served("ce", path)
    capsys.readouterr()  # save_pretrained's progress bar
    assert main(["serve", "--model", str(path), "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"lmforge serve: error: --model {path}: {refusal}") and err.count("\n") == 1


def test_a_task_json_beside_a_model_without_its_head_is_refused_before_the_weights(tmp_path, monkeypatch):
    """--model DIR whose task.json says rerank beside a model with no classification head read the whole
    model to refuse it after; its config.json says so first, naming both files."""
    import json
    import re

    import pytest

    import lmforge.io.native
    from lmforge.io import CheckpointError

    def read(*args, **kwargs):
        raise AssertionError("the weights were read")

    tokenizer = train_tokenizer(TEXTS, "wordpiece", 120, family="bert")
    lmforge.build(lmforge.tiny("bert-base", vocab_size=tokenizer.vocab_size)).save(tmp_path)
    tokenizer.save(tmp_path)
    (tmp_path / "task.json").write_text(json.dumps({"kind": "rerank"}))
    monkeypatch.setattr(lmforge.io.native, "load_weights", read)
    want = f"{tmp_path / 'config.json'} gives the model no classification head, where its task.json says"
    with pytest.raises(CheckpointError, match=f"^{re.escape(want)} rerank$"):
        load_served("odd", tmp_path)
