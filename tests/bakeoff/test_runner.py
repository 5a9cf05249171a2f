"""The runner: arms' specs carry their options, a rerun gives the same numbers, a finished arm is
skipped and an interrupted one resumes to the numbers of an uninterrupted run."""
from __future__ import annotations

import json
import os
import re
import shutil
import warnings

import pytest

from lmforge import objectives
from lmforge.bakeoff import check_plan, run_plan
from lmforge.bakeoff.results import ResultsWarning
from lmforge.bakeoff.runner import RESULTS, arm_spec, read_results, registered


def test_an_arms_spec_carries_its_options_and_example_format(tiny_plan):
    tiny_plan["arms"][0]["examples"] = {"cross_documents": False}
    plan = check_plan(tiny_plan)
    mlm, electra = (arm_spec(plan, arm) for arm in plan.arms)
    assert mlm.examples.cross_documents is False and objectives.get("mlm").examples.cross_documents
    assert electra.options == {"ratio": 0.5} and electra.build == objectives.get("rtd").build
    with registered([mlm, electra]):
        assert objectives.get("bakeoff.tiny.electra") is electra
    assert "bakeoff.tiny.electra" not in objectives.names()  # the registry is left as it was


def _values(out):
    return {(r["arm"], r["seed"], r["task"]): r["metrics"] for r in read_results(out)}


@pytest.mark.slow
def test_same_seed_same_numbers_and_an_interrupted_plan_resumes(tmp_path, tiny_plan, one_thread):
    plan = check_plan(tiny_plan)
    first = run_plan(plan, tmp_path / "a", log=lambda line: None)
    assert {(r["arm"], r["task"]) for r in first} == {("mlm", "sentiment"), ("electra", "sentiment")}
    for row in first:
        assert abs(row["pretrain_flops"] - plan.budget) / plan.budget <= 0.02
    run_plan(plan, tmp_path / "b", log=lambda line: None)
    assert _values(tmp_path / "a") == _values(tmp_path / "b")  # same seed, same numbers
    # interrupt b inside electra's pretraining: its last checkpoint, result line and final model gone
    arm = tmp_path / "b" / "electra" / "seed-0" / "pretrain"
    checkpoints = sorted((arm / "checkpoints").iterdir())
    shutil.rmtree(checkpoints[-1])
    shutil.rmtree(arm / "final")
    (arm / "done.json").unlink()
    lines = (tmp_path / "b" / RESULTS).read_text().splitlines()
    (tmp_path / "b" / RESULTS).write_text(lines[0] + "\n")
    mlm_metrics = (tmp_path / "b" / "mlm" / "seed-0" / "pretrain" / "metrics.jsonl").stat().st_mtime_ns
    logged = []
    run_plan(plan, tmp_path / "b", log=logged.append)
    assert any("mlm seed 0: done already" in line for line in logged)
    assert (tmp_path / "b" / "mlm" / "seed-0" / "pretrain" / "metrics.jsonl").stat().st_mtime_ns == \
        mlm_metrics
    assert _values(tmp_path / "a") == _values(tmp_path / "b")  # resumed to the same numbers
    assert json.loads((tmp_path / "b" / "schedule.json").read_text())["electra"]["steps"] > 1


@pytest.mark.slow
def test_a_checkpoint_continued_and_fine_tuned_as_it_is_and_a_preset_from_scratch(tmp_path, tiny_plan,
                                                                                  one_thread):
    first = dict(tiny_plan, arms=tiny_plan["arms"][:1], claims=[])
    run_plan(check_plan(first), tmp_path / "a", log=lambda line: None)
    checkpoint = str(tmp_path / "a" / "mlm" / "seed-0" / "pretrain" / "final")
    arms = [{"name": "none", "objective": "mlm", "model": checkpoint, "pretrain": False},
            {"name": "scratch", "objective": "mlm", "preset": "bert-tiny",
             "overrides": tiny_plan["arms"][0]["overrides"], "pretrain": False},
            {"name": "more", "objective": "mlm", "model": checkpoint,
             "corpus": {"source": "builtin", "documents": 60, "seed": 1}}]
    plan = check_plan(dict(first, arms=arms,
                           claims=[{"better": "more", "worse": "none", "task": "sentiment"}]))
    rows = {r["arm"]: r for r in run_plan(plan, tmp_path / "b", log=lambda line: None)}
    a = read_results(tmp_path / "a")[0]
    assert rows["none"]["metrics"] == a["metrics"]  # the same model fine-tuned with the same seed
    assert rows["none"]["pretrain_flops"] == 0 and rows["more"]["pretrain_steps"] > 0
    assert not (tmp_path / "b" / "none" / "seed-0" / "pretrain").exists()
    assert (tmp_path / "b" / "more" / "seed-0" / "pretrain" / "final" / "config.json").is_file()
    assert rows["scratch"]["pretrain_steps"] == 0 and \
        (tmp_path / "b" / "scratch" / "seed-0" / "sentiment" / "best").is_dir()


def _fake_training(monkeypatch) -> tuple:
    """(arms pretrained, arms fine-tuned), in order: a run directory and a made-up row, no training."""
    from lmforge.bakeoff import runner

    trained, tuned = [], []

    def fake_pretrain(objective, out, *rest, **options):
        trained.append(out.parent.parent.name)
        (out / "final").mkdir(parents=True, exist_ok=True)

    def fake_finetune(self, arm, seed, task, model):
        tuned.append(arm.name)
        return {"plan": self.plan.name, "arm": arm.name, "seed": seed, "task": task, "metric": "accuracy",
                "value": float(len(tuned)), "metrics": {"accuracy": float(len(tuned))}}

    monkeypatch.setattr(runner, "pretrain", fake_pretrain)
    monkeypatch.setattr(runner.BakeOff, "finetune", fake_finetune)
    return trained, tuned


def test_a_changed_plan_reruns_what_changed_and_says_so(tmp_path, tiny_plan, monkeypatch):
    """Results are keyed by a fingerprint of what made them: a changed arm or recipe reruns only what it
    touches (one line says so), and its old result is replaced, never averaged with the new one."""
    trained, tuned = _fake_training(monkeypatch)
    run_plan(check_plan(tiny_plan), tmp_path, log=lambda line: None)
    assert sorted(trained) == ["electra", "mlm"] and sorted(tuned) == ["electra", "mlm"]
    trained.clear(), tuned.clear()
    tiny_plan["arms"][1]["duplication"] = 1  # electra's arm changes (static masking), mlm's does not
    logged = []
    rows = run_plan(check_plan(tiny_plan), tmp_path, log=logged.append)
    assert trained == ["electra"] and tuned == ["electra"]
    assert any("mlm seed 0: done already" in line for line in logged)
    assert sum("electra seed 0: the plan changed" in line for line in logged) == 2  # pretraining, result
    assert len(rows) == 2 and {r["arm"]: r["value"] for r in rows}["electra"] == 1.0  # replaced, not added
    trained.clear(), tuned.clear()
    tiny_plan["finetune"]["lr"] = 5e-4  # the recipe changes: every result again, no pretraining
    run_plan(check_plan(tiny_plan), tmp_path, log=lambda line: None)
    assert trained == [] and sorted(tuned) == ["electra", "mlm"]


def test_a_torn_last_line_reruns_only_its_unit_and_leaves_the_file_clean(tmp_path, tiny_plan, monkeypatch):
    """A kill mid-append tears the last row: the rerun cuts it (saying so, naming the file), runs that unit
    alone again, and writes its row on a line of its own, so the next rerun has nothing left to do."""
    tiny_plan["seeds"] = [0, 1]
    plan = check_plan(tiny_plan)
    trained, tuned = _fake_training(monkeypatch)
    run_plan(plan, tmp_path, log=lambda line: None)
    path = tmp_path / RESULTS
    last = json.loads(path.read_text().splitlines()[-1])
    os.truncate(path, path.stat().st_size - 40)  # truncate -s -40: the last row torn, no newline
    trained.clear(), tuned.clear()
    logged = []
    with pytest.warns(ResultsWarning, match=re.escape(f"{path}: its last line was torn")):
        run_plan(plan, tmp_path, log=logged.append)
    assert trained == [] and tuned == [last["arm"]]  # its pretraining was finished: the fine-tuning alone
    unit = f"{last['arm']} seed {last['seed']}"
    assert any(f"{unit}: pretrained already" in line for line in logged)  # said as it is: kept, not trained
    assert not any(f"pretrained {unit}" in line for line in logged)
    assert path.read_bytes().endswith(b"\n") and len(path.read_text().splitlines()) == 4
    tuned.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every line whole and verified: nothing to warn about
        rows = run_plan(plan, tmp_path, log=lambda line: None)
    assert tuned == [] and len({(r["arm"], r["seed"], r["task"]) for r in rows}) == 4


@pytest.mark.parametrize("ratio", ["half", 1.5, 0])
def test_an_objective_option_out_of_its_range_is_refused_naming_the_plan_and_arm(tiny_plan, ratio):
    """When the plan is checked, naming the plan, the arm and the option once (the objective's own range)."""
    from lmforge.bakeoff import PlanError

    tiny_plan["arms"][1]["options"] = {"ratio": ratio}
    said = rf"^p\.yaml: arms\[1\]\.options\.ratio: ratio={ratio!r}: must be a number > 0 and <= 1$"
    with pytest.raises(PlanError, match=said):
        check_plan(tiny_plan, "p.yaml")


def test_an_objective_option_its_objective_refuses_is_a_plan_error_before_any_arm_trains(tmp_path, tiny_plan):
    from lmforge.bakeoff import PlanError

    tiny_plan["arms"][1]["options"] = {"ratio": 0.5, "replace": [0.5, 0.5, 0.5]}  # rtd's masked LM reads it
    said = r"^p\.yaml: arms\[1\]\.options\.replace: replace=\[0\.5, 0\.5, 0\.5\]"
    with pytest.raises(PlanError, match=said):
        check_plan(tiny_plan, "p.yaml")
    assert not any(tmp_path.iterdir())
    assert not (tmp_path / "mlm").exists() and not (tmp_path / "electra").exists()  # no arm began


@pytest.mark.parametrize("damage", ["edit", "cut", "delete"])
def test_a_tasks_splits_are_verified_on_read_and_a_deleted_file_is_built_again(tmp_path, tiny_plan, damage):
    """An edited label (still JSON) was fine-tuned on unsaid; a cut file was a JSON error naming no file."""
    from lmforge.bakeoff.results import ResultsError
    from lmforge.bakeoff.runner import task_splits

    task = tiny_plan["tasks"][0]
    built = task_splits(task, tmp_path)
    (path,) = (tmp_path / "tasks").iterdir()
    text = path.read_text()
    if damage == "delete":
        path.unlink()
        assert task_splits(task, tmp_path) == built == task_splits(task, tmp_path)
        return
    label = '"label": "1"'
    path.write_text(text.replace(label, '"label": "0"', 1) if damage == "edit" else text[: len(text) // 2])
    assert label in text
    with pytest.raises(ResultsError) as refused:
        task_splits(task, tmp_path)
    said = str(refused.value)
    assert said.startswith(f"{path}: ") and "\n" not in said and "delete it to build it again" in said


@pytest.mark.parametrize("damaged", ["corpus", "tokenizer"])
def test_the_corpus_and_tokenizer_a_plan_built_are_verified_on_every_rerun(tmp_path, tiny_plan, damaged):
    """A changed word of the corpus, or of the tokenizer's vocabulary (still JSON), was pretrained on by the
    arms a rerun had still to run, unsaid, beside arms that had the plan's own (helper's probe)."""
    from lmforge.bakeoff.results import ResultsError
    from lmforge.bakeoff.runner import BakeOff
    from lmforge.tokenizer import TokenizerError

    plan = check_plan(tiny_plan, "p.yaml")
    BakeOff(plan, tmp_path, log=lambda line: None)
    corpus, = (tmp_path / "corpus").iterdir()
    tokenizer, = (tmp_path / "tokenizers").glob("*/tokenizer/tokenizer.json")
    file = corpus if damaged == "corpus" else tokenizer
    built = file.read_bytes()
    BakeOff(plan, tmp_path, log=lambda line: None)  # a rerun reads them as they were
    word = b" the " if damaged == "corpus" else b'"the":'
    assert word in built
    file.write_bytes(built.replace(word, word.replace(b"the", b"thd"), 1))
    with pytest.raises(ResultsError if damaged == "corpus" else TokenizerError) as refused:
        BakeOff(plan, tmp_path, log=lambda line: None)
    said = str(refused.value)
    assert said.startswith(str(file)) and ("built.json" if damaged == "corpus" else "sha256.json") in said
    assert "\n" not in said
    file.unlink()  # deleted: built again, the same bytes
    BakeOff(plan, tmp_path, log=lambda line: None)
    assert file.read_bytes() == built


def test_each_row_records_the_hardware_its_pretraining_and_fine_tuning_ran_on(tmp_path, tiny_plan,
                                                                              monkeypatch):
    """The pretraining's device is kept in its done.json (a rerun that keeps it names the device it ran on,
    not this process's), the fine-tuning's is this process's."""
    from lmforge.bakeoff import runner

    _fake_training(monkeypatch)
    monkeypatch.setattr(runner, "hardware", lambda device="auto": f"device {device} here")
    tiny_plan["finetune"]["device"] = "cpu"
    rows = run_plan(check_plan(tiny_plan), tmp_path, log=lambda line: None)
    assert [r["hardware"] for r in rows] == \
        [{"pretrain": "device auto here", "finetune": "device cpu here"}] * 2
    done = json.loads((tmp_path / "mlm" / "seed-0" / "pretrain" / "done.json").read_text())
    assert done["hardware"] == "device auto here"


def test_under_torchrun_the_python_api_refuses_as_the_command_does(tmp_path, tiny_plan, monkeypatch):
    """Each rank would pretrain every arm, world size x the budget the schedule counted: refused before
    anything is built, as `lmforge bakeoff` refuses it."""
    from lmforge.bakeoff import PlanError

    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(PlanError, match="without torchrun"):
        run_plan(check_plan(tiny_plan), tmp_path / "out", log=lambda line: None)
    assert not (tmp_path / "out").exists()


def test_a_max_len_past_the_models_positions_is_refused_before_a_schedule_is_counted(tmp_path, tiny_plan):
    """max_len 128 on a 64-position model: pretrain refuses it when the arm starts, so a dry run had printed
    steps and FLOPs at 128 tokens an example that no run would spend."""
    from lmforge.bakeoff import PlanError
    from lmforge.bakeoff.runner import BakeOff

    tiny_plan["pretrain"]["max_len"], tiny_plan["budget"] = 128, 4.0e9
    with pytest.raises(PlanError, match=r"arms\.mlm: max_len 128 is over the model's max_seq_len \(64\)"):
        BakeOff(check_plan(tiny_plan), tmp_path, log=lambda line: None)
    assert not (tmp_path / "schedule.json").exists()


def test_a_fine_tuning_max_len_past_the_models_positions_is_refused_before_any_arm_pretrains(tmp_path,
                                                                                            tiny_plan):
    """finetune.max_len 96 on a 64-position model: fine-tuning refused it when the arm's first task started,
    after its pretraining had run (hours); now refused with the schedules, by fine-tuning's own check (which
    takes its default, 128, as reading to the model's context)."""
    from lmforge.bakeoff import PlanError
    from lmforge.bakeoff.runner import BakeOff

    tiny_plan["finetune"]["max_len"] = 96
    with pytest.raises(PlanError) as err:
        BakeOff(check_plan(tiny_plan), tmp_path, log=lambda line: None)
    said = str(err.value)
    assert said.endswith(": arms.mlm: finetune.max_len=96: more tokens than the model reads "
                         "(max_seq_len=64)")
    assert "\n" not in said and not (tmp_path / "schedule.json").exists() and not (tmp_path / "mlm").exists()


def test_a_runs_checks_read_each_unchanged_corpus_file_once_and_still_refuse_an_edit(tmp_path, tiny_plan,
                                                                                    monkeypatch, hash_reads,
                                                                                    settled):
    """The start, each arm's sampling and each arm's pretraining verify the plan's corpus files: each read
    every file in full again. A run reads each once; a file edited before a later use is still refused."""
    from lmforge.bakeoff.plan_corpus import CorpusError
    from lmforge.bakeoff.runner import BakeOff

    files = [tmp_path / "c0.txt", tmp_path / "c1.txt"]
    for i, file in enumerate(files):
        file.write_text("".join(f"The fox {i} jumps over the dog. The dog sleeps in the sun {j}.\n\n"
                                for j in range(60)))
    tiny_plan["corpus"] = {"source": "files", "files": [str(f) for f in files]}
    _fake_training(monkeypatch)
    run = BakeOff(check_plan(tiny_plan), tmp_path / "o", log=lambda line: None)
    assert len(run.run()) == 2
    assert hash_reads == {"c0.txt": 1, "c1.txt": 1}
    files[1].write_text(files[1].read_text().replace("fox", "cat"))
    with pytest.raises(CorpusError, match=re.escape(f"{files[1]}: changed since")):
        run.corpus_of(run.plan.arms[0])
