"""Pruning during fine-tuning: the settings a resume is checked against are the run's own; the schedule
reaches the sparsity asked within the run."""
import json

import pytest

from lmforge.cli import main
from lmforge.compress.sparse_finetune import (SETTINGS, SparseConfig, check_settings, record_settings,
    schedule_steps)
from lmforge.compress.sparsity import cubic_sparsity
from lmforge.config.options import OptionsError
from tests.tasks.core import sentiment, tiny, tokenizer


def _settings_of_a_run(out, settings: dict, resume: bool) -> None:
    """What prune_finetune does with a run's settings: checked once, recorded where they are a fresh run's."""
    if check_settings(out, settings, resume):
        record_settings(out, settings)


def test_a_fresh_run_after_a_killed_first_save_records_its_own_settings(tmp_path):
    _settings_of_a_run(tmp_path, {"--sparsity": 0.5, "--steps": 6}, resume=False)
    (tmp_path / "checkpoints" / ".step-0000002.tmp").mkdir(parents=True)  # killed in its first save
    _settings_of_a_run(tmp_path, {"--sparsity": 0.7, "--steps": 4}, resume=False)  # started afresh
    assert json.loads((tmp_path / SETTINGS).read_text())["--sparsity"] == 0.7
    assert check_settings(tmp_path, {"--sparsity": 0.7, "--steps": 4}, resume=True) is False  # the run's
    with pytest.raises(ValueError,
                       match="--sparsity 0.5 differs from the run being resumed .*--sparsity 0.7.*another "
                             "out \\(--out\\)$"):
        check_settings(tmp_path, {"--sparsity": 0.5, "--steps": 6}, resume=True)


def test_a_resume_with_another_rerank_loss_is_refused(tmp_path):
    """The recorded task options were a hand-kept list without the rerank ones: a pruned reranker resumed
    with another loss trained on under it, unrefused; they are fine-tuning's trained settings now."""
    from lmforge.compress.sparse_finetune import _settings
    from lmforge.tasks.finetune import TaskConfig, trained_settings

    sparse = SparseConfig(method="magnitude", sparsity=0.5)
    _settings_of_a_run(tmp_path, _settings("m", 6, TaskConfig(loss="listwise"), sparse), resume=False)
    check_settings(tmp_path, _settings("m", 6, TaskConfig(loss="listwise"), sparse), resume=True)
    with pytest.raises(ValueError, match="loss=bce differs from the run being resumed .*loss=listwise"):
        check_settings(tmp_path, _settings("m", 6, TaskConfig(loss="bce"), sparse), resume=True)
    recorded = {k for k in json.loads((tmp_path / SETTINGS).read_text()) if k.endswith("=")}
    assert {f"{k}=" for k in trained_settings(TaskConfig())} <= recorded


@pytest.mark.parametrize("entry", ["python", "cli"])
def test_a_run_checks_its_settings_once_before_reading_the_model(entry, tmp_path, monkeypatch):
    """prune_finetune checked its settings twice a run (once unwritten before the model was read, again to
    write them after the records): once now, from Python and from `lmforge prune`, before any read of the
    model; a fresh run's settings are still recorded."""
    import lmforge.compress.sparse_finetune as sparse
    from lmforge.train import TrainConfig

    events, check, defaults = [], sparse.check_settings, sparse.checkpoint_defaults
    monkeypatch.setattr(sparse, "check_settings", lambda *a, **k: events.append("check") or check(*a, **k))
    monkeypatch.setattr(sparse, "checkpoint_defaults",
                        lambda *a, **k: events.append("read") or defaults(*a, **k))
    tiny("bert-base", n_layers=1).save(tmp_path / "m")
    tokenizer().save(tmp_path / "m")
    records, out = sentiment(40)["train"][:8], tmp_path / "o"
    if entry == "python":
        sparse.prune_finetune(str(tmp_path / "m"), "cls", records, None, out, log=lambda *a: None,
                              train_cfg=TrainConfig(steps=4, batch_size=4, seed=0, progress=False),
                              sparse_cfg=SparseConfig(method="magnitude", sparsity=0.5))
    else:
        data = tmp_path / "d.jsonl"
        data.write_text("".join(json.dumps(r) + "\n" for r in records))
        assert main(["prune", "--model", str(tmp_path / "m"), "--task", "cls", "--method", "magnitude",
                     "--sparsity", "0.5", "--data", str(data), "--train", str(data), "--out", str(out),
                     "--steps", "4", "progress=false"]) == 0
    assert events.count("check") == 1 and events[0] == "check" and "read" in events
    assert json.loads((out / SETTINGS).read_text())["--sparsity"] == 0.5


@pytest.mark.parametrize("steps, start, end", [(2, 0.1, 0.7), (3, 0.1, 0.7), (10, 0.1, 0.9), (4, 0.0, 0.0)])
def test_the_schedule_reaches_the_sparsity_within_the_run(steps, start, end):
    cfg = SparseConfig(method="magnitude", sparsity=0.5, start=start, end=end)
    first, last = schedule_steps(cfg, steps)
    assert cubic_sparsity(steps - 1, 0.5, first, last) == 0.5  # the last optimiser step trains at it


@pytest.mark.parametrize("steps, start, end", [(1, 0.1, 0.7), (10, 0.1, 1.0), (1, 0.0, 0.0)])
def test_a_run_that_ends_before_the_sparsity_is_reached_is_refused_naming_end(steps, start, end, tmp_path,
                                                                              capsys):
    """--steps 1 (or end=1) saved a model at sparsity 0 (0.4993) and said it 'rounds to' that."""
    cfg = SparseConfig(method="magnitude", sparsity=0.5, start=start, end=end)
    with pytest.raises(OptionsError, match="would end less sparse") as err:
        schedule_steps(cfg, steps)
    assert err.value.field == "end" and cubic_sparsity(steps - 1, 0.5, round(start * steps),
                                                        round(end * steps)) < 0.5
    assert "give more steps or a smaller end" in str(err.value)  # said "--steps", a flag Python never gave
    model = tiny("bert-base", n_layers=1)
    model.save(tmp_path / "m")
    tokenizer().save(tmp_path / "m")
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in sentiment(40)["train"][:8]))
    assert main(["prune", "--model", str(tmp_path / "m"), "--task", "cls", "--method", "magnitude",
                 "--sparsity", "0.5", "--data", str(data), "--train", str(data), "--out", str(tmp_path / "o"),
                 "--steps", str(steps), f"start={start}", f"end={end}", "progress=false"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "end=" in err and not (tmp_path / "o").exists()


def test_pruning_a_sigmoid_regression_folder_trains_and_keeps_its_activation(tmp_path):
    """prune_finetune built its task from bare options: a sigmoid regression folder trained MSE on the raw
    logit and its final/task.json said identity; it takes the folder's activation as finetune does."""
    from lmforge.compress.sparse_finetune import prune_finetune
    from lmforge.tasks.finetune import TaskConfig, make_task, save_model, task_info
    from lmforge.train import TrainConfig

    folder = tmp_path / "sts"
    save_model(make_task("regression", tiny("bert-base", n_layers=1), tokenizer(), [],
                         TaskConfig(activation="sigmoid")), folder)
    train = [{"text": t, "text_pair": "a film", "label": v} for t, v in (("good", 0.9), ("bad", 0.1))]
    prune_finetune(str(folder), "regression", train, None, tmp_path / "run",
                   train_cfg=TrainConfig(steps=4, batch_size=2, lr=1e-3, seed=0, log_every=100),
                   sparse_cfg=SparseConfig(method="magnitude", sparsity=0.5), log=lambda *a: None)
    assert task_info(tmp_path / "run" / "final")["activation"] == "sigmoid"
    # Python's records are read as finetune reads them: the error names the argument and the record's line
    with pytest.raises(OptionsError, match=r"^train: line 1: label 3 is outside \[0, 1\]") as err:
        prune_finetune(str(folder), "regression", [{**train[0], "label": 3}], None, tmp_path / "bad",
                       train_cfg=TrainConfig(steps=4, batch_size=2, lr=1e-3, seed=0, log_every=100),
                       sparse_cfg=SparseConfig(method="magnitude", sparsity=0.5), log=lambda *a: None)
    assert err.value.field == "train"


def test_python_records_of_integer_class_ids_prune_as_finetune_reads_them(tmp_path):
    """prune_finetune took Python's records unread: a dataset's class ids 0 and 1 were no labels ("task 'cls'
    needs the list of labels"); they are "0" and "1", as finetune and a file read them."""
    from lmforge.compress.sparse_finetune import prune_finetune
    from lmforge.tasks.finetune import task_info
    from lmforge.train import TrainConfig

    train = [{"text": "a good film", "label": 1}, {"text": "a bad film", "label": 0}]
    prune_finetune(tiny("bert-base", n_layers=1), "cls", train, train, tmp_path, tokenizer=tokenizer(),
                   train_cfg=TrainConfig(steps=4, batch_size=2, seed=0, log_every=100, progress=False),
                   sparse_cfg=SparseConfig(method="magnitude", sparsity=0.5), log=lambda *a: None)
    assert task_info(tmp_path / "final")["labels"] == ["0", "1"]


def test_a_cross_encoder_s_trained_head_is_scored_before_pruning(tmp_path):
    """A one-output CrossEncoder's head reads as rerank or regression: pruning it for regression reported
    its 'before' metric as a fresh head's (not reported), though the head is trained."""
    pytest.importorskip("transformers")
    from lmforge.compress.sparse_finetune import run_sparse_prune
    from lmforge.train import TrainConfig
    from tests.tasks.hf_reference import reference_dir

    _, folder = reference_dir(tmp_path / "ce", num_labels=1, sentence_transformers={"activation_fn": None})
    records = [{"text": t, "text_pair": "a film", "label": v} for t, v in (("good", 0.9), ("bad", 0.1))] * 2
    cfg = TrainConfig(steps=4, batch_size=2, seed=0, log_every=100, progress=False)
    report = run_sparse_prune(folder, "regression", records, None, records, tmp_path / "run", train_cfg=cfg,
                              sparse_cfg=SparseConfig(method="magnitude", sparsity=0.5), log=lambda *a: None)
    assert report["before"]["metric"] is not None and "metric_note" not in report["before"]


@pytest.mark.parametrize("options, said", [
    ({"doc_stride": 10}, "doc_stride=10: an option of qa tasks"),
    ({"max_len": 500}, r"max_len=500: more tokens than the model reads \(max_seq_len=128\)"),
    ({"freeze_layers": 1}, "freeze_layers=1: a fine-tuning option that pruning during fine-tuning does not"),
    ({"freeze_backbone": True}, "freeze_backbone=True: a fine-tuning option that pruning"),
    ({"freeze_embeddings": True}, "freeze_embeddings=True: a fine-tuning option that pruning"),
    ({"layer_decay": 0.5}, "layer_decay=0.5: a fine-tuning option that pruning"),
])
def test_a_refused_task_option_leaves_no_output_folder(tmp_path, options, said):
    """doc_stride=10 on a cls run was refused after prune_settings.json was written (the refused run left its
    out behind); freezing and layer_decay were taken and ignored (every block trained at one rate)."""
    from lmforge.compress.sparse_finetune import prune_finetune
    from lmforge.tasks.finetune import TaskConfig
    from lmforge.train import TrainConfig

    with pytest.raises(OptionsError, match=f"^{said}") as err:
        prune_finetune(tiny("bert-base", n_layers=1), "cls", sentiment()["train"][:8], None, tmp_path / "o",
                       train_cfg=TrainConfig(steps=2, batch_size=4, progress=False),
                       sparse_cfg=SparseConfig(method="magnitude", sparsity=0.5),
                       task_cfg=TaskConfig(**options), tokenizer=tokenizer(), log=lambda *a: None)
    assert err.value.field == next(iter(options)) and not (tmp_path / "o").exists()


@pytest.mark.parametrize("resume", [False, True])
def test_an_out_holding_a_run_s_checkpoints_is_refused_naming_out_before_the_model_is_read(tmp_path, resume):
    """prune_finetune(out=a folder holding checkpoints) without resume was refused only by Trainer.fit, once
    the model was loaded and the records encoded: here the missing model was the error said. A resume (its
    settings the run's) gets past the check to the model."""
    from lmforge.compress.sparse_finetune import _settings, _task_options, prune_finetune
    from lmforge.train import TrainConfig
    from lmforge.utils.atomic import UnsafePath

    out, model, sparse = tmp_path / "run", str(tmp_path / "missing"), SparseConfig(method="magnitude",
                                                                                    sparsity=0.5)
    cfg = TrainConfig(steps=2, batch_size=4, progress=False)
    record_settings(out, _settings(model, 2, _task_options(cfg, None, None), sparse))
    (out / "checkpoints" / "step-0000002").mkdir(parents=True)
    with pytest.raises(Exception) as err:
        prune_finetune(model, "cls", sentiment()["train"][:8], None, out, train_cfg=cfg, sparse_cfg=sparse,
                       resume=resume, log=lambda *a: None)
    if resume:  # past the check: the model is read, and found missing
        assert err.value.field == "model" and f"'{model}' is neither a model directory" in str(err.value)
    else:
        assert isinstance(err.value, UnsafePath) and err.value.field == "out"
        assert str(err.value) == (f"out {out} already holds a run's checkpoints: pass resume=True (--resume) "
                                  "to continue it, or another folder")
