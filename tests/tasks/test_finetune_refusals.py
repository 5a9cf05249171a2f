"""Fine-tuning's refusals, each in one line naming what it refuses: options badly typed, of another kind of
task or of validation without validation records, a damaged task.json or config.json, a label the model does
not know, a link as the output folder, a model object without its tokenizer, and ELMo."""
import pytest

import lmforge
from lmforge.config.options import OptionsError
from lmforge.tasks import task_class
from lmforge.tasks.finetune import TaskConfig, encode_split, finetune, task_info
from lmforge.tasks.formats import builtin, read_task_file
from lmforge.train import TrainConfig
from tests.tasks.core import cfg, quiet, sentiment, tiny, tokenizer


def test_task_config_is_validated():
    with pytest.raises(ValueError, match="unknown fine-tuning option"):
        TaskConfig.from_dict({"freeze": True})
    with pytest.raises(ValueError, match="layer_decay"):
        TaskConfig(layer_decay=0.0)
    # numbers as their fields' types
    assert TaskConfig.from_dict({"n_best": 5.0, "null_threshold": 1}).n_best == 5


@pytest.mark.parametrize("name, text, message", [
    ("task.json", '{"kind": ', "task.json is not valid JSON: Expecting value: line 1 column 10"),
    ("task.json", "[1, 2]", "task.json must hold a JSON object {...}, not list [1, 2]"),
    ("task.json", '{"kind": "sentiment"}', "task.json: \"kind\" 'sentiment' is not a task kind (cls, pair"),
    ("task.json", '{"kind": "cls", "labels": "01"}', "task.json: \"labels\" must be a list of labels"),
    ("task.json", '{"kind": "cls", "max_len": 0}', "task.json: \"max_len\" must be a positive integer"),
    ("task.json", '{"kind": "cls", "labels": ["0", ["1"]]}', 'task.json: "labels" must be a list'),
    ("task.json", '{"kind": "cls", "labels": [{}, null]}', 'task.json: "labels" must be a list'),
    ("config.json", "{not json", "config.json is not valid JSON: Expecting property name"),
    ("config.json", b"\xff{}", "config.json is not UTF-8 text (byte 0)"),
    ("config.json", '{"id2label": {"a": "x"}}', "config.json: id2label keys must be label numbers"),
    ("config.json", '{"id2label": {"0": ["x"]}}', "config.json: id2label values must be label names"),
])
def test_a_bad_task_or_config_json_is_one_line_naming_the_file(tmp_path, name, text, message):
    file = tmp_path / name
    file.write_bytes(text) if isinstance(text, bytes) else file.write_text(text)
    with pytest.raises(ValueError) as err:
        task_info(tmp_path)
    assert str(err.value).startswith(str(tmp_path / message.split(" ")[0])) and message in str(err.value)
    assert "\n" not in str(err.value)


def test_a_label_unknown_to_the_model_names_the_data_file(tmp_path):
    data = tmp_path / "test_names.jsonl"
    data.write_text('{"text": "good", "label": "0"}\n{"text": "bad", "label": "neg"}\n')
    task = task_class("cls")(tiny(), tokenizer(), labels=["0", "1"])
    with pytest.raises(OptionsError,
                       match=f"^{data}: line 2: label 'neg' is not one of the training labels") as err:
        encode_split(task, read_task_file(data, "cls"), "data")
    assert err.value.field is None  # a file's records: the message names the file and line


@pytest.mark.parametrize("options, field", [
    ({"freeze_backbone": "maybe"}, "freeze_backbone"), ({"keep_best": 1}, "keep_best"),
    ({"text_to_text": "yes"}, "text_to_text"),
    ({"max_len": 10 ** 9}, "max_len"),
    ({"max_len": 0}, "max_len"),
    ({"num_beams": 10 ** 6}, "num_beams"),
    ({"patience": -1}, "patience"),
    ({"null_threshold": float("nan")}, "null_threshold"),
    ({"layer_decay": 0}, "layer_decay"),
    ({"threshold": 1}, "threshold"), ({"threshold": 0.0}, "threshold"),
    ({"prefix": 3}, "prefix"),
])
def test_task_options_are_strictly_typed_and_bounded_both_ways(options, field):
    with pytest.raises(ValueError) as err:
        TaskConfig.from_dict(options)
    assert str(err.value).startswith(field) and "\n" not in str(err.value)
    cfg = TaskConfig.from_dict({"freeze_backbone": "true", "label_all": "false", "text_to_text": "auto"})
    assert cfg.freeze_backbone is True and cfg.label_all is False and cfg.text_to_text is None


@pytest.mark.parametrize("kind, options, field, owner", [
    ("cls", {"num_beams": 4}, "num_beams", "seq2seq"), ("cls", {"doc_stride": 10}, "doc_stride", "qa"),
    ("cls", {"loss": "bce"}, "loss", "rerank"), ("cls", {"label_all": True}, "label_all", "tagging"),
    ("cls", {"prefix": "sst2"}, "prefix", "text-to-text and seq2seq"),
    ("cls", {"threshold": 0.3}, "threshold", "multilabel"),
    ("tagging", {"n_best": 3}, "n_best", "qa"),
])
def test_an_option_of_another_kind_of_task_is_refused_never_ignored(tmp_path, kind, options, field, owner):
    data = sentiment()["train"][:8] if kind == "cls" else builtin("tagging", 20, 0)[1]["train"][:8]
    run = (lambda options: finetune(tiny(), tokenizer(), kind, data, None, tmp_path, cfg(steps=1),
                                    TaskConfig(**options), log=quiet))
    with pytest.raises(OptionsError, match=f"^{field}=.*: an option of {owner} tasks; a {kind} task") as err:
        run(options)
    assert err.value.field == field and not (tmp_path / "final").exists()
    run({"num_beams": 1})  # the default of another task's option is no option given


@pytest.mark.parametrize("train_options, task_options, field", [
    ({"eval_every": 2}, {}, "eval_every"), ({}, {"patience": 3}, "patience"),
    ({}, {"keep_best": False}, "keep_best"), ({}, {"eval_batch_size": 8}, "eval_batch_size")])
def test_a_validation_setting_without_validation_records_is_refused(tmp_path, train_options, task_options,
                                                                    field):
    with pytest.raises(OptionsError, match=f"^{field}=.*: a setting of validation, and the run") as err:
        finetune(tiny(), tokenizer(), "cls", sentiment()["train"][:8], None, tmp_path,
                 cfg(steps=1, **train_options), TaskConfig(**task_options), log=quiet)
    assert err.value.field == field and not (tmp_path / "final").exists()
    assert "(valid, --valid FILE)" in str(err.value)  # the argument Python gives, beside the flag


def test_a_preset_without_a_tokenizer_names_the_argument_and_the_flag(tmp_path):
    """finetune("bert-base") said "(--tokenizer DIR)" alone, a ValueError: the argument too, typed."""
    with pytest.raises(OptionsError, match=r"^preset 'bert-base' needs a tokenizer \(tokenizer=, --tokenizer"
                                           r" DIR\)") as err:
        finetune("bert-base", None, "cls", sentiment()["train"][:8], None, tmp_path, cfg(steps=1), log=quiet)
    assert err.value.field == "tokenizer" and not (tmp_path / "final").exists()


@pytest.mark.parametrize("link", ["out", "out/checkpoints"])
def test_a_link_as_the_output_folder_or_its_checkpoints_is_refused_naming_it_before_any_work(
        tmp_path, monkeypatch, link):
    from lmforge.tasks import finetune as module
    from lmforge.utils.atomic import UnsafePath

    (tmp_path / "elsewhere").mkdir()
    if link != "out":
        (tmp_path / "out").mkdir()
    (tmp_path / link).symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    monkeypatch.setattr(module, "load_model", lambda *a, **k: pytest.fail("work began before the refusal"))
    with pytest.raises(UnsafePath, match=f"^{tmp_path / link}: is a symbolic link"):
        finetune(tiny(), tokenizer(), "cls", sentiment()["train"][:8], None, tmp_path / "out", cfg(steps=1),
                 log=quiet)
    assert list((tmp_path / "elsewhere").iterdir()) == []


@pytest.mark.parametrize("damage", ["label", "max_len", "delete"])
def test_task_json_is_verified_against_the_checksum_config_json_records(tmp_path, damage):
    """A changed value that is still a valid task.json (labels swapped, one bit of max_len) was read as the
    model's task unsaid, and a deleted one made a fine-tuned model a bare encoder (helper's probe)."""
    from lmforge.io import CheckpointError
    from lmforge.tasks.finetune import save_model

    task = task_class("cls")(tiny(), tokenizer(), labels=["neg", "pos"], max_len=64)
    path = save_model(task, tmp_path / "m")
    assert task_info(path)["labels"] == ["neg", "pos"]
    text = (path / "task.json").read_text()
    if damage == "delete":
        (path / "task.json").unlink()
    else:
        swapped = text.replace('"neg"', '"x"').replace('"pos"', '"neg"').replace('"x"', '"pos"')
        edited = swapped if damage == "label" else text.replace('"max_len": 64', '"max_len": 65')
        assert edited != text
        (path / "task.json").write_text(edited)
    with pytest.raises(CheckpointError) as refused:
        task_info(path)
    said = str(refused.value)
    assert said.startswith(str(path / "task.json")) and "config.json" in said and "\n" not in said


def test_a_model_object_without_its_tokenizer_and_elmo_are_refused_naming_their_argument(tmp_path):
    elmo, records = lmforge.build(lmforge.tiny("elmo-small", vocab_size=300)), sentiment()["train"][:4]
    cfg = TrainConfig(steps=1)
    with pytest.raises(OptionsError, match="a tokenizer is needed next to a model object") as err:
        finetune(elmo, None, "cls", records, None, tmp_path / "o", cfg)
    assert err.value.field == "tokenizer"
    with pytest.raises(OptionsError, match="ELMo is fine-tuned feature-based.*lmforge features") as err:
        finetune(elmo, tokenizer(), "cls", records, None, tmp_path / "o", cfg)
    assert err.value.field == "model" and not (tmp_path / "o" / "checkpoints").exists()


def test_a_python_run_never_writes_over_the_model_or_tokenizer_it_reads(tmp_path):
    """finetune(DIR, out=DIR) wrote checkpoints/ and final/ into the model folder, and out=RUN of a model in
    RUN/final would have replaced it at the end, where --out refuses both before any work."""
    from lmforge.utils.atomic import UnsafePath

    model = tmp_path / "run" / "final"
    tiny(n_layers=1).save(model)
    tokenizer().save(model)
    before, train = sorted(model.iterdir()), sentiment()["train"][:8]
    for given, tok, out, field in [(str(model), None, model, "model"),
                                   (str(model), None, model.parent, "model"),
                                   (lmforge.load(model), str(model), model, "model"),
                                   (tiny(n_layers=1), str(model), model, "tokenizer")]:
        with pytest.raises(UnsafePath, match=f"^out {out} (is|holds) the input {field} ") as err:
            finetune(given, tok, "cls", train, None, out, cfg(steps=1), log=quiet)
        assert err.value.field == "out"
    assert sorted(model.iterdir()) == before and sorted(model.parent.iterdir()) == [model]


def test_evaluate_never_writes_its_predictions_over_a_file_of_the_model_folder(tmp_path):
    """evaluate(DIR, records, out=DIR/task.json) replaced the model's task.json with its predictions (the
    folder no longer loaded), where the command's --out is refused; a file of another name is written."""
    from lmforge.tasks.finetune import evaluate
    from lmforge.utils.atomic import UnsafePath
    from tests.tasks.core import saved_classifier

    records = sentiment()["validation"][:4]
    model = saved_classifier(tmp_path / "m", "bert-base", "bert", sentiment()["train"], 32)
    before = {p.name: p.read_bytes() for p in model.iterdir()}
    for name in ("task.json", "config.json", "model.safetensors"):
        with pytest.raises(UnsafePath, match=f"^out {model / name} lies inside the input model ") as err:
            evaluate(str(model), records, out=model / name)
        assert err.value.field == "out"
    assert {p.name: p.read_bytes() for p in model.iterdir()} == before
    evaluate(str(model), records, out=model / "predictions.jsonl")
    assert len((model / "predictions.jsonl").read_text().splitlines()) == 4


@pytest.mark.parametrize("resume", [False, True])
def test_a_run_s_checkpoints_in_out_or_none_to_resume_are_refused_naming_out_before_the_model_is_read(
        tmp_path, monkeypatch, resume):
    """finetune(..., out) on a folder holding checkpoints, without resume, was a plain FileExistsError raised
    by Trainer.fit once the model was loaded and the records encoded; resume with none, NothingToResume
    there."""
    from lmforge.tasks import finetune as module
    from lmforge.train.checkpoint import NothingToResume
    from lmforge.utils.atomic import UnsafePath

    if not resume:
        (tmp_path / "run" / "checkpoints" / "step-0000004").mkdir(parents=True)
    monkeypatch.setattr(module, "load_model", lambda *a, **k: pytest.fail("work began before the refusal"))
    with pytest.raises(NothingToResume if resume else UnsafePath) as err:
        finetune(tiny(), tokenizer(), "cls", sentiment()["train"][:8], None, tmp_path / "run", cfg(steps=1),
                 resume=resume, log=quiet)
    said, out = str(err.value), tmp_path / "run"
    assert "\n" not in said and ("no checkpoint under" in said if resume else said ==
                                 f"out {out} already holds a run's checkpoints: pass resume=True (--resume) "
                                 "to continue it, or another folder")
    assert resume or err.value.field == "out"


@pytest.mark.parametrize("train_cfg, task_cfg, name, cls", [
    ({"steps": 1}, None, "train_cfg", "TrainConfig"), (None, {"max_len": 32}, "task_cfg", "TaskConfig"),
    (None, TrainConfig(steps=1), "task_cfg", "TaskConfig")])
def test_an_options_object_of_another_type_is_refused_naming_its_argument(tmp_path, train_cfg, task_cfg, name,
                                                                          cls):
    """finetune(task_cfg={...}) was a TypeError, train_cfg={...} an AttributeError, deep in the run."""
    with pytest.raises(OptionsError) as err:
        finetune(tiny(), tokenizer(), "cls", sentiment()["train"][:8], None, tmp_path / "run",
                 train_cfg or cfg(steps=1), task_cfg, log=quiet)
    kind = type(task_cfg if name == "task_cfg" else train_cfg).__name__
    assert str(err.value) == f"{name} must be a {cls}, got {kind}" and err.value.field == name
    assert not (tmp_path / "run").exists()
