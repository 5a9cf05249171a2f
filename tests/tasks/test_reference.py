"""Hugging Face fine-tuned checkpoints: their head's meaning (problem_type, num_labels, id2label) is read
as the reference reads it, with its predictions, or refused naming the field."""
import json
from pathlib import Path

import pytest
import torch

from lmforge.tasks.finetune import evaluate, task_info
from tests.tasks.core import tokenizer

transformers = pytest.importorskip("transformers")
TEXTS = ["a good film", "a bad film", "the plot was dull", "great acting and a fine story"]


def reference_dir(path, architecture="BertForSequenceClassification", **config):
    """A tiny random reference checkpoint saved by save_pretrained, with an lmforge tokenizer."""
    tok = tokenizer()
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2,
                                  num_attention_heads=2, intermediate_size=64, max_position_embeddings=128,
                                  **config)
    model = getattr(transformers, architecture)(cfg).eval()
    model.save_pretrained(path)
    tok.save(path)
    return model, path


def reference_logits(model):
    """The reference's logits of each text, one at a time (no padding), on lmforge's token ids."""
    with torch.no_grad():
        return [model(torch.tensor([tokenizer().encode(t, None, max_length=128).ids])).logits[0]
                for t in TEXTS]


def predictions(path, kind, tmp_path):
    """evaluate's predictions of TEXTS (as unlabelled cls records) by the model directory `path`."""
    out = tmp_path / "predictions.jsonl"
    evaluate(path, [{"text": t} for t in TEXTS], kind, out=out)
    return [json.loads(line)["prediction"] for line in out.read_text().splitlines()]


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


SIGMOID = "torch.nn.modules.activation.Sigmoid"


@pytest.mark.parametrize("marker", [{"sentence_transformers": {"activation_fn": SIGMOID, "version": "4.1.0"}},
                                    {"sbert_ce_default_activation_function": SIGMOID}])
@pytest.mark.parametrize("n", [2, 3])
def test_a_cross_encoder_is_read_as_the_text_pair_task_its_outputs_say(tmp_path, marker, n):
    """A sentence-transformers CrossEncoder (v4+'s block, or the older key) scores text pairs: its classes
    are a pair task's, with no --task to choose between cls and pair."""
    from lmforge.tasks.finetune import fine_tuned_task
    from lmforge.tasks.reference import task_file

    _, path = reference_dir(tmp_path / "ce", num_labels=n, **marker)
    info = task_info(path)
    assert info["kinds"] == ["pair"] and "CrossEncoder" in info["why"]
    written = task_file(path / "config.json", json.loads((path / "config.json").read_text()), 8)
    assert written["kind"] == "pair"
    assert fine_tuned_task(path, []).kind == "pair"
    with pytest.raises(ValueError, match="CrossEncoder.* is not a cls task; it is read as pair"):
        fine_tuned_task(path, [], "cls")


@pytest.mark.parametrize("marker", [{"sentence_transformers": {"activation_fn": SIGMOID, "version": "4.1.0"}},
                                    {"sbert_ce_default_activation_function": SIGMOID}])
def test_a_one_score_cross_encoder_ranks_or_regresses_pairs_as_the_task_says(tmp_path, marker):
    """One output: an ms-marco reranker or an STS regressor (cross-encoder/stsb-*), both over text pairs; the
    data's task says which (served as a reranker), and a single-text class task is refused."""
    from lmforge.serve.models import served_task
    from lmforge.tasks.finetune import fine_tuned_task

    _, path = reference_dir(tmp_path / "ce", num_labels=1, **marker)
    assert task_info(path)["kinds"] == ["rerank", "regression"] and served_task(path)["kind"] == "rerank"
    assert fine_tuned_task(path, [], "regression").kind == "regression"
    with pytest.raises(ValueError, match="the task kind is needed"):
        fine_tuned_task(path, [])
    with pytest.raises(ValueError, match="CrossEncoder.* is not a cls task; it is read as rerank or regr"):
        fine_tuned_task(path, [], "cls")


def test_a_cross_encoder_pair_classifier_predicts_the_reference_argmax_without_a_task(tmp_path):
    model, path = reference_dir(tmp_path / "ce", num_labels=2, id2label={0: "no", 1: "yes"},
                                sentence_transformers={"activation_fn": SIGMOID})
    out, pairs = tmp_path / "predictions.jsonl", list(zip(TEXTS, TEXTS[1:] + TEXTS[:1]))
    evaluate(path, [{"text": a, "text_pair": b} for a, b in pairs], out=out)
    with torch.no_grad():
        encoded = [tokenizer().encode(a, b, max_length=128) for a, b in pairs]
        want = [["no", "yes"][int(model(torch.tensor([e.ids]), token_type_ids=torch.tensor([e.segment_ids]))
                                  .logits[0].argmax())] for e in encoded]
    assert [json.loads(line)["prediction"] for line in out.read_text().splitlines()] == want


def test_a_plain_classifier_still_leaves_cls_or_pair_to_the_data(tmp_path):
    """No CrossEncoder's config field: cls or pair is the data's. A sentence_transformers block, its
    activation_fn in it or not, is a CrossEncoder's (CrossEncoder.save alone writes it): pair."""
    _, path = reference_dir(tmp_path / "m", num_labels=2)
    assert task_info(path)["kinds"] == ["cls", "pair"]
    _, path = reference_dir(tmp_path / "ce", num_labels=2, sentence_transformers={"version": "4.1.0"})
    assert task_info(path)["kinds"] == ["pair"] and task_info(path).get("activation") is None


def test_lmforge_evaluate_reads_a_cross_encoder_s_task_without_task(tmp_path):
    """The command line asks the folder for its own kind as Python does: a CrossEncoder's pair task."""
    from lmforge.cli import main

    _, path = reference_dir(tmp_path / "ce", num_labels=2, id2label={0: "no", 1: "yes"},
                            sentence_transformers={"activation_fn": SIGMOID})
    data, out = tmp_path / "pairs.jsonl", tmp_path / "predictions.jsonl"
    data.write_text("".join(json.dumps({"text": a, "text_pair": b}) + "\n" for a, b in zip(TEXTS, TEXTS[1:])))
    assert main(["evaluate", "--model", str(path), "--data", str(data), "--out", str(out)]) == 0
    predictions = [json.loads(line)["prediction"] for line in out.read_text().splitlines()]
    assert len(predictions) == 3 and set(predictions) <= {"no", "yes"}


@pytest.mark.parametrize("activation, read", [(SIGMOID, torch.sigmoid),
                                              ("torch.nn.modules.linear.Identity", lambda x: x)])
def test_an_sts_cross_encoder_regresses_through_its_activation(tmp_path, activation, read):
    """An STS cross-encoder's scores are its logits through its config's activation (CrossEncoder.predict:
    sigmoid, in [0, 1]); the raw logits had been scored against its labels."""
    model, path = reference_dir(tmp_path / "ce", num_labels=1,
                                sbert_ce_default_activation_function=activation)
    want = [float(read(logits[0])) for logits in reference_logits(model)]
    assert predictions(path, "regression", tmp_path) == pytest.approx(want, abs=1e-5)
    plain_model, plain = reference_dir(tmp_path / "plain", num_labels=1)  # no CrossEncoder: its raw score
    raw = [float(logits[0]) for logits in reference_logits(plain_model)]
    assert predictions(plain, "regression", tmp_path) == pytest.approx(raw, abs=1e-5)


@pytest.mark.parametrize("route", ["fine_tuned_task", "Reranker.load", "load_served"])
def test_a_cross_encoder_s_activation_is_read_once_by_the_task_reader_on_every_route(tmp_path, route,
                                                                                      monkeypatch):
    """fine_tuned_task, Reranker.load and the server each read config.json's activation_fn again after the
    task was built; now reference_task alone reads it (into task_info), and the task takes it as an option."""
    from lmforge.pipelines.rerank import Reranker
    from lmforge.serve.models import load_served
    from lmforge.tasks import reference
    from lmforge.tasks.finetune import fine_tuned_task

    identity = {"activation_fn": "torch.nn.modules.linear.Identity"}
    _, path = reference_dir(tmp_path / "ce", num_labels=1, sentence_transformers=identity)
    calls = []
    read = reference.cross_encoder_activation
    monkeypatch.setattr(reference, "cross_encoder_activation",
                        lambda *a, **k: calls.append(a) or read(*a, **k))
    task = {"fine_tuned_task": lambda: fine_tuned_task(path, [], "rerank"),
            "Reranker.load": lambda: Reranker.load(path).task,
            "load_served": lambda: load_served("ce", path).task}
    assert task[route]().activation == "identity" and len(calls) == 1
    if route == "Reranker.load":
        assert Reranker.load(path).score(-2.5) == -2.5  # the logit itself, as CrossEncoder.predict gives it


def test_the_activation_is_a_checked_task_option_kept_in_task_json(tmp_path):
    """One option for the CLI, Python and the server: its values checked, refused for a task that does not
    read it, recorded in task.json (so rebuild_task applies it) and a converted CrossEncoder's too."""
    from lmforge.config.options import OptionsError
    from lmforge.tasks.finetune import TaskConfig, make_task
    from lmforge.tasks.reference import task_file
    from tests.tasks.core import tiny

    with pytest.raises(OptionsError, match="activation='tanh' is not one of sigmoid, identity"):
        TaskConfig(activation="tanh")
    with pytest.raises(OptionsError, match="activation.*a cls task does not read it"):
        make_task("cls", tiny(), tokenizer(), [], TaskConfig(activation="sigmoid"), ["a", "b"])
    for kind, default in (("regression", "identity"), ("rerank", "sigmoid")):
        assert make_task(kind, tiny(), tokenizer(), [], TaskConfig()).info()["activation"] == default
        chosen = make_task(kind, tiny(), tokenizer(), [], TaskConfig(activation="sigmoid"))
        assert chosen.activation == "sigmoid"
    _, path = reference_dir(tmp_path / "ce", num_labels=1, sbert_ce_default_activation_function=SIGMOID)
    written = task_file(path / "config.json", json.loads((path / "config.json").read_text()), 8)
    assert written["activation"] == "sigmoid" == task_info(path)["activation"]


def test_an_activation_lmforge_cannot_score_with_is_refused_naming_the_file(tmp_path):
    """A CrossEncoder's Tanh (or another activation_fn) is refused where its folder's task is read."""
    from lmforge.pipelines.rerank import Reranker

    _, path = reference_dir(tmp_path / "ce", num_labels=1,
                            sentence_transformers={"activation_fn": "torch.nn.Tanh"})
    with pytest.raises(ValueError, match=r"config.json: activation_fn 'torch.nn.Tanh' is not supported"):
        Reranker.load(path)
    from lmforge.serve.models import load_served

    with pytest.raises(ValueError, match=r"config.json: activation_fn 'torch.nn.Tanh' is not supported"):
        load_served("ce", path)  # the server too: it had named only the option, not the file


def test_an_activation_lmforge_cannot_score_with_is_refused_before_the_weights_are_read(tmp_path):
    """fine_tuned_task read config.json's activation_fn only after loading the model: the refusal now comes
    first, so a folder whose weights cannot be read at all still gets the activation's error."""
    import lmforge
    from lmforge.io.native import CheckpointError
    from lmforge.pipelines.rerank import Reranker

    _, path = reference_dir(tmp_path / "ce", num_labels=1,
                            sentence_transformers={"activation_fn": "torch.nn.modules.activation.Tanh"})
    (path / "model.safetensors").write_bytes(b"not weights")
    with pytest.raises(CheckpointError):
        lmforge.load(path)  # the weights are unreadable: any read of them would fail so
    refusal = r"config.json: activation_fn 'torch.nn.modules.activation.Tanh' is not supported"
    with pytest.raises(ValueError, match=refusal):
        evaluate(path, [{"text": "a", "text_pair": "b", "label": 0.5}], "regression")
    with pytest.raises(ValueError, match=refusal):
        Reranker.load(path)


def test_a_tanh_cross_encoder_converts_and_serves_as_a_backbone_refused_only_where_it_scores(tmp_path):
    """reference_task and read_labels refused an unsupported activation_fn whatever the use, so a Tanh
    CrossEncoder could not be converted nor fine-tuned for another task; it is refused only to score."""
    import lmforge
    from lmforge.tasks.finetune import TaskConfig, finetune
    from lmforge.tasks.reference import task_file
    from lmforge.train import TrainConfig

    tanh = "torch.nn.modules.activation.Tanh"
    _, path = reference_dir(tmp_path / "ce", num_labels=1, sentence_transformers={"activation_fn": tanh})
    written = task_file(path / "config.json", json.loads((path / "config.json").read_text()), 8)
    assert written["activation"] == tanh
    lmforge.save(lmforge.load(path), tmp_path / "hf", format="hf")  # convert --to hf: the class as it came
    exported = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert exported["sentence_transformers"] == {"activation_fn": tanh}
    train = [{"text": "a good film", "text_pair": "a film", "label": t} for t in ("yes", "no")]
    cfg = TrainConfig(steps=1, batch_size=2, lr=1e-3, seed=0, log_every=100)
    finetune(path, None, "pair", train, None, tmp_path / "pair", cfg, log=lambda *a: None)  # a backbone
    scores = [{**train[0], "label": 0.5}]
    with pytest.raises(ValueError, match=r"config.json: activation_fn '.*Tanh' is not supported"):
        finetune(path, None, "regression", scores, None, tmp_path / "kept", cfg, log=lambda *a: None)
    finetune(path, None, "regression", scores, None, tmp_path / "mse", cfg,
             TaskConfig(activation="identity"), log=lambda *a: None)
    with pytest.raises(ValueError, match=r"config.json: activation_fn '.*Tanh' is not supported"):
        evaluate(path, scores, "regression")


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


def test_a_folders_task_options_are_read_one_way_each_caller_its_own_default_length(tmp_path):
    """saved_options builds fine_tuned_task's and the server's TaskConfig alike: task.json's max_len over the
    caller's default, its text_to_text and prefix, the kind's own options, an unscorable activation refused
    naming the file."""
    from lmforge.tasks.finetune import TaskConfig
    from lmforge.tasks.reference import saved_options

    info = {"kind": "regression", "activation": "sigmoid", "label_all": True, "prefix": "stsb"}
    cfg = TaskConfig(**saved_options(tmp_path, info, "regression", 96))
    assert (cfg.max_len, cfg.activation, cfg.prefix, cfg.label_all) == (96, "sigmoid", "stsb", False)
    assert saved_options(None, {**info, "max_len": 12}, "regression", 96)["max_len"] == 12
    (tmp_path / "task.json").write_text(json.dumps({"kind": "regression", "activation": "torch.nn.Tanh"}))
    with pytest.raises(ValueError, match=r"task.json: activation_fn 'torch.nn.Tanh' is not supported"):
        saved_options(tmp_path, {"activation": "torch.nn.Tanh"}, "regression", 128)
    assert "activation" not in saved_options(tmp_path, {"activation": "torch.nn.Tanh"}, "cls", 128)


def test_the_activation_membership_is_tested_once_each_face_keeping_its_error():
    """known_activation (io/labels.py) is the one membership test: the task option's OptionsError, the
    file's ValueError naming it, and TaskConfig's declared choices all take the same values."""
    from lmforge.config.options import OptionsError
    from lmforge.io.labels import ACTIVATIONS, known_activation, scoring_activation
    from lmforge.tasks.classify import checked_activation
    from lmforge.tasks.finetune import TaskConfig

    for value in (*ACTIVATIONS, None, "tanh", "Sigmoid", 1):
        known = known_activation(value)
        assert known == (value is None or value in ACTIVATIONS)
        if known:
            assert checked_activation(value, "identity") == (value or "identity")
            assert scoring_activation("f", value) == value
            assert TaskConfig(activation=value).activation == value
            continue
        with pytest.raises(OptionsError, match="activation must be one of sigmoid, identity"):
            checked_activation(value, "identity")
        with pytest.raises(ValueError, match="^f: activation_fn .* is not supported"):
            scoring_activation("f", value)
        refused = "^activation(=.* is not one of sigmoid, identity| must be a str)"
        with pytest.raises(OptionsError, match=refused):
            TaskConfig(activation=value)
