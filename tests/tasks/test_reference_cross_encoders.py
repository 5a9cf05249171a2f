"""sentence-transformers CrossEncoder checkpoints: read as the text-pair task their outputs say, scored
through their activation (read once, a checked task option kept in task.json), and an activation lmforge
cannot score with refused naming the file, only where it scores."""
import json

import pytest
import torch

from lmforge.tasks.finetune import evaluate, task_info
from tests.tasks.core import tokenizer
from tests.tasks.hf_reference import TEXTS, predictions, reference_dir, reference_logits

transformers = pytest.importorskip("transformers")
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


def test_a_folders_task_options_are_read_one_way_each_caller_its_own_default_length(tmp_path):
    """saved_options builds fine_tuned_task's and the server's TaskConfig alike: task.json's max_len over the
    caller's default, its text_to_text and prefix, the kind's own options; an unscorable activation is refused
    naming the file by check_scored, which both callers make before reading weights (and saved_options not
    again)."""
    from lmforge.tasks.finetune import TaskConfig
    from lmforge.tasks.reference import check_scored, saved_options

    info = {"kind": "regression", "activation": "sigmoid", "label_all": True, "prefix": "stsb"}
    cfg = TaskConfig(**saved_options(tmp_path, info, "regression", 96))
    assert (cfg.max_len, cfg.activation, cfg.prefix, cfg.label_all) == (96, "sigmoid", "stsb", False)
    assert saved_options(None, {**info, "max_len": 12}, "regression", 96)["max_len"] == 12
    (tmp_path / "task.json").write_text(json.dumps({"kind": "regression", "activation": "torch.nn.Tanh"}))
    with pytest.raises(ValueError, match=r"task.json: activation_fn 'torch.nn.Tanh' is not supported"):
        check_scored(tmp_path, {"activation": "torch.nn.Tanh"}, "regression")
    check_scored(tmp_path, {"activation": "torch.nn.Tanh"}, "cls")  # no activation option: not read
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
