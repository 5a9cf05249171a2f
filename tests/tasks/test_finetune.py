"""The fine-tuning runner: freezing, layer-wise lr decay, early stopping, the best model, a real run."""
import json
import shutil

import pytest
import torch

import lmforge
from lmforge.config.options import OptionsError
from lmforge.tasks.finetune import TaskConfig, evaluate, finetune, task_info
from lmforge.tasks.formats import builtin, read_task_file
from tests.tasks.core import cfg, quiet, sentiment, tiny, tokenizer


def test_early_stopping_stops_after_patience(tmp_path):
    data = sentiment()
    summary = finetune(tiny(), tokenizer(), "cls", data["train"][:16], data["validation"][:16], tmp_path,
                       cfg(steps=50, lr=1e-12, eval_every=1), TaskConfig(patience=2), log=quiet)
    assert summary["steps"] == 3 and summary["stopped_early"] and summary["best_step"] == 1
    logged = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in logged] == [1, 2, 3] and "valid_accuracy" in logged[-1]


def test_resumed_run_keeps_the_best_score_and_patience(tmp_path):
    data = sentiment()

    def go(resume=False):
        return finetune(tiny(), tokenizer(), "cls", data["train"][:16], data["validation"][:16], tmp_path,
                        cfg(steps=50, lr=1e-12, eval_every=1, save_every=1, keep_last=5),
                        TaskConfig(patience=2), resume=resume, log=quiet)

    whole = go()
    assert whole["steps"] == 3 and whole["best_step"] == 1
    assert go(resume=True)["steps"] == 3  # a run that stopped early stays stopped
    shutil.rmtree(tmp_path / "checkpoints" / "step-0000003")  # killed after step 2's checkpoint
    resumed = go(resume=True)  # step 3 is one more evaluation without a better score: stop there
    assert resumed["steps"] == 3 and resumed["best_step"] == 1 and resumed["best"] == whole["best"]


def test_a_run_stopped_early_goes_on_when_resumed_with_more_patience_and_says_whether_it_does(tmp_path):
    data = sentiment()

    def go(patience, resume=False):
        said = []
        summary = finetune(tiny(), tokenizer(), "cls", data["train"][:16], data["validation"][:16], tmp_path,
                           cfg(steps=6, lr=1e-12, eval_every=1), TaskConfig(patience=patience), resume=resume,
                           log=said.append)
        return summary, next((line for line in said if line.startswith("resumed from")), "")

    assert go(2)[0]["steps"] == 3  # stopped early: two evaluations without a better score
    same, line = go(2, resume=True)
    assert same["steps"] == 3 and \
        line.endswith("the run stopped early (its evaluator): nothing more is trained")
    longer, line = go(0, resume=True)  # patience is read only when deciding to stop: a resume may change it
    assert longer["steps"] == 6 and not longer["stopped_early"] and \
        "evaluator's rule as given now goes on" in line


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("sentiment")
    data = sentiment()
    summary = finetune(tiny(n_layers=1), tokenizer(), "cls", data["train"], data["validation"], out,
                       cfg(steps=40, batch_size=16, eval_every=10), log=quiet)
    return out, summary


def test_tiny_fine_tune_on_builtin_sentiment_beats_chance(run):
    out, summary = run
    majority = max(sum(r["label"] == c for r in sentiment()["validation"]) for c in "01") / \
        len(sentiment()["validation"])
    assert summary["primary"] == "accuracy" and summary["best"]["accuracy"] > max(0.75, majority + 0.15)
    assert json.loads((out / "summary.json").read_text())["best"] == summary["best"]
    assert summary["seed"] == 0  # the run's seed, said where a reader looks (cfg()'s default)


def test_best_model_reloads_with_the_same_validation_score(run, tmp_path):
    out, summary = run
    for name in ("best", "final"):
        assert {"config.json", "model.safetensors", "tokenizer.json", "task.json"} <= \
            {p.name for p in (out / name).iterdir()}
    assert json.loads((out / "best" / "task.json").read_text()) == \
        {"kind": "cls", "labels": ["0", "1"], "max_len": 128}
    records = sentiment()["validation"]
    metrics = evaluate(out / "best", records, out=tmp_path / "pred.jsonl")
    assert metrics == pytest.approx(summary["best"])
    rows = [json.loads(line) for line in (tmp_path / "pred.jsonl").read_text().splitlines()]
    assert len(rows) == len(records) and rows[0]["line"] == 0 and rows[0]["gold"] == records[0]["label"]
    assert sum(r["prediction"] == r["gold"] for r in rows) / len(rows) == pytest.approx(metrics["accuracy"])


def test_unlabelled_records_get_predictions_only(run, tmp_path):
    out, _ = run
    records = [{"text": "It is superb.", "label": None, "line": 2}]
    assert evaluate(out / "final", records, out=tmp_path / "p.jsonl") == {}
    assert json.loads((tmp_path / "p.jsonl").read_text())["prediction"] in ("0", "1")


def test_records_cut_to_max_len_are_said_by_finetune_and_evaluate_and_counted_once(run, tmp_path):
    out, _ = run
    long = {"text": " ".join(["superb"] * 200), "label": "1"}
    records = [long, {"text": "It is superb.", "label": "1"}, {**long, "label": "0"}]
    said = []
    evaluate(out / "final", records, max_len=16, log=said.append)
    assert said == ["2 of 3 evaluated records are longer than max_len=16 tokens and were cut (the model "
                    "reads only their first 16); raise max_len to read more"]
    said.clear()
    evaluate(out / "final", records[1:2], max_len=16, log=said.append)  # none cut: nothing said
    assert said == []
    said.clear()
    finetune(tiny(n_layers=1), tokenizer(), "cls", records, records[:2], tmp_path, cfg(steps=1),
             TaskConfig(max_len=16), log=said.append)
    assert [line.split(" are ")[0] for line in said if "max_len" in line] == [
        "2 of 3 training records", "1 of 2 validation records"]

@pytest.mark.parametrize("options, field", [
    ({"device": "gpu"}, "device"), ({"device": 3.5}, "device"), ({"max_len": 0}, "max_len"),
    ({"batch_size": 0}, "batch_size"), ({"batch_size": 2.5}, "batch_size")])  # the caller's name for it
def test_evaluate_refuses_a_bad_device_or_length_naming_it(run, options, field):
    out, _ = run  # device="gpu" was torch's RuntimeError; max_len=0 silently the model's own length
    with pytest.raises(OptionsError) as err:
        evaluate(out / "final", sentiment()["validation"][:2], **options)
    assert err.value.field == field and str(err.value).startswith(field) and "\n" not in str(err.value)


def test_tagging_label_all_is_kept_in_task_json(tmp_path):
    data = builtin("tagging", 20, 0)[1]["train"]
    finetune(tiny(), tokenizer(), "tagging", data[:8], None, tmp_path, cfg(steps=1),
             TaskConfig(label_all=True), log=quiet)
    info = json.loads((tmp_path / "final" / "task.json").read_text())
    assert info["label_all"] is True and info["kind"] == "tagging"


def test_the_fresh_head_is_drawn_from_the_run_seed_not_the_callers_rng(tmp_path):
    data = sentiment()

    def head(seed: int, caller_seed: int) -> torch.Tensor:
        model = tiny()
        torch.manual_seed(caller_seed)  # the caller's RNG state at the call
        finetune(model, tokenizer(), "cls", data["train"][:8], None, tmp_path / f"{seed}-{caller_seed}",
                 cfg(steps=1, lr=1e-12, seed=seed), log=quiet)
        return model.heads["classification"].classifier.weight.detach().clone()

    first = head(0, 1)
    assert torch.equal(first, head(0, 2))
    assert not torch.equal(first, head(1, 1))


def weights(path) -> dict:
    from safetensors.torch import load_file

    return load_file(path / "final" / "model.safetensors")


def test_a_preset_draws_its_initial_weights_from_the_run_seed(tmp_path):
    data = sentiment()

    def go(seed: int, name: str) -> dict:
        torch.rand(3)  # the caller draws in between: a preset's init must not depend on it
        finetune("bert-tiny", tokenizer(), "cls", data["train"][:8], None, tmp_path / name,
                 cfg(steps=1, seed=seed), log=quiet)
        return weights(tmp_path / name)

    first, again, other = go(1, "a"), go(1, "b"), go(2, "c")
    assert first.keys() == again.keys() and all(torch.equal(first[k], again[k]) for k in first)
    assert not torch.equal(first["tokens.weight"], other["tokens.weight"])


def test_a_preset_leaves_the_callers_rng_alone():
    from lmforge.tasks.finetune import load_model

    state = torch.get_rng_state()
    built = [load_model("bert-tiny", tokenizer(), {"n_layers": 1}, seed=s)[0].state_dict() for s in (3, 3, 4)]
    assert torch.equal(torch.get_rng_state(), state)
    assert all(torch.equal(built[0][k], built[1][k]) for k in built[0])
    assert not torch.equal(built[0]["tokens.weight"], built[2]["tokens.weight"])


def test_the_finetune_command_is_reproducible(tmp_path):
    from lmforge.cli import main

    tokenizer().save(tmp_path / "tok")

    def go(name: str, seed: int) -> bytes:
        torch.rand(3)
        argv = ["finetune", "--model", "bert-tiny", "--tokenizer", str(tmp_path / "tok"),
                "--builtin", "sentiment", "--builtin-size", "60", "--out", str(tmp_path / name),
                "--steps", "2", "--seed", str(seed), "n_layers=1", "d_model=32", "n_heads=2", "d_ff=64",
                "batch_size=8", "progress=false"]
        assert main(argv) == 0
        return (tmp_path / name / "final" / "model.safetensors").read_bytes()

    first = go("a", 5)
    assert go("b", 5) == first and go("c", 6) != first


def test_a_resume_on_other_validation_data_is_refused_and_on_the_same_goes_on(tmp_path):
    data = sentiment()

    def go(valid, resume=False):
        return finetune(tiny(), tokenizer(), "cls", data["train"][:16], valid, tmp_path,
                        cfg(steps=3, eval_every=1, save_every=1), TaskConfig(patience=5), resume=resume,
                        log=quiet)

    go(data["validation"][:16])
    edited = [dict(r) for r in data["validation"][:16]]
    edited[2]["label"] = "1" if edited[2]["label"] == "0" else "0"  # one gold label changed
    for other, said in ((edited, "the same 16 examples in count"), (data["validation"][:12], "16 examples")):
        with pytest.raises(ValueError, match=f"validated on other data \\({said}") as refused:
            go(other, resume=True)
        assert str(refused.value).endswith("choose another out (--out)")  # the field, not --out alone
    assert go(data["validation"][:16], resume=True)["steps"] == 3


def test_a_resume_with_other_training_options_is_refused_naming_the_option_and_others_go_on(tmp_path):
    """freeze_*, layer_decay, a loss option ... decide the updates: a resume with another would continue
    another run than the one its checkpoints hold; patience and the like only decide when to stop."""
    data = sentiment()

    def go(resume=False, **options):
        return finetune(tiny(), tokenizer(), "cls", data["train"][:16], data["validation"][:8], tmp_path,
                        cfg(steps=2, eval_every=1, save_every=1), TaskConfig(**options), resume=resume,
                        log=quiet)

    go()
    for option, value in (("freeze_layers", 1), ("layer_decay", 0.5), ("freeze_embeddings", True)):
        was = getattr(TaskConfig(), option)
        with pytest.raises(ValueError, match=f": {option}={was!r} \\(the run's\\) vs {value!r} \\(now\\)"):
            go(resume=True, **{option: value})
    assert go(resume=True, patience=3, eval_batch_size=4)["steps"] == 2


def test_a_datasets_integer_class_ids_fine_tune_as_the_same_labels_read_from_a_file(tmp_path):
    """Python's records are read as a file's (tasks/fields.py): integer class ids, as lmforge.data.tasks and
    Hugging Face datasets give them, were refused ("needs the list of labels") though a file of the same
    records trained; both now train the labels "0", "1" with the same weights."""
    from lmforge.data import tasks

    records = tasks(40)["sentiment"]["train"][:8]
    assert {type(r["label"]) for r in records} == {int}
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    for name, train in (("python", records), ("file", read_task_file(path, "cls"))):
        finetune(tiny(), tokenizer(), "cls", train, train, tmp_path / name, cfg(steps=1), log=quiet)
    assert task_info(tmp_path / "python" / "final")["labels"] == ["0", "1"]
    assert task_info(tmp_path / "file" / "final") == task_info(tmp_path / "python" / "final")
    python, file = weights(tmp_path / "python"), weights(tmp_path / "file")
    assert all(torch.equal(python[k], file[k]) for k in file)
    assert evaluate(tmp_path / "python" / "final", records) == evaluate(tmp_path / "file" / "final", records)


def test_a_fine_tuned_model_fine_tuned_again_keeps_the_label_of_each_output(tmp_path):
    """A directory's labels in another order than sorted (a Hugging Face id2label {0: pos, 1: neg}) were
    replaced by the records' sorted labels while its trained head was kept: every output changed label."""
    from lmforge.tasks.finetune import make_task, save_model

    task = make_task("cls", tiny(), tokenizer(), [], TaskConfig(), ["pos", "neg"])
    last = [m for m in task.task_head.modules() if isinstance(m, torch.nn.Linear)][-1]
    with torch.no_grad():
        last.bias.copy_(torch.tensor([5.0, -5.0]))  # output 0, "pos", whatever the text
    save_model(task, tmp_path / "model")
    train = [{"text": "a good film", "label": "pos"}, {"text": "a bad film", "label": "neg"}]
    finetune(str(tmp_path / "model"), None, "cls", train, None, tmp_path / "run", cfg(steps=1, lr=1e-9),
             log=quiet)
    assert task_info(tmp_path / "run" / "final")["labels"] == ["pos", "neg"]
    # a loaded model stands for its folder, as the command line passes it (it had kept the sorted labels)
    finetune(lmforge.load(tmp_path / "model"), tokenizer(), "cls", train, None, tmp_path / "loaded",
             cfg(steps=1, lr=1e-9), log=quiet)
    assert task_info(tmp_path / "loaded" / "final")["labels"] == ["pos", "neg"]
    out = tmp_path / "predictions.jsonl"
    evaluate(tmp_path / "run" / "final", [{"text": r["text"]} for r in train], out=out)
    assert [json.loads(line)["prediction"] for line in out.read_text().splitlines()] == ["pos", "pos"]


def test_a_folder_s_activation_is_taken_only_by_a_run_of_its_own_kind(tmp_path):
    """A reranker's sigmoid is no regression's (its labels past 1 were refused), nor a plain regressor's
    identity a reranker's (it served raw logits): another kind's run gets its own default; the same kind
    keeps the folder's."""
    from lmforge.tasks.finetune import checkpoint_defaults, make_task, save_model

    for kind, activation, other in (("rerank", "sigmoid", "regression"), ("regression", "identity", "rerank"),
                                    ("rerank", "identity", "regression")):
        folder = tmp_path / f"{kind}-{activation}"
        save_model(make_task(kind, tiny(), tokenizer(), [], TaskConfig(activation=activation)), folder)
        assert checkpoint_defaults(str(folder), other, [], None, TaskConfig())[1].activation is None
        assert checkpoint_defaults(str(folder), kind, [], None, TaskConfig())[1].activation == activation
        loaded = lmforge.load(folder)  # as the command line passes it: the folder's too
        assert checkpoint_defaults(loaded, kind, [], None, TaskConfig())[1].activation == activation
    train = [{"text": "a good film", "text_pair": "a film", "label": 3.5}]
    finetune(str(tmp_path / "rerank-sigmoid"), None, "regression", train, None, tmp_path / "run",
             cfg(steps=1), log=quiet)
    assert task_info(tmp_path / "run" / "final")["activation"] == "identity"
