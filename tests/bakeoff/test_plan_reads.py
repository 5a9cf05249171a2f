"""A plan gives nothing its runs would not read: an arm's unknown objective option (a TypeError hours into
the run), what only pretraining reads on an arm that does not pretrain, static masking with an objective
that draws no corruption, and a task's field its source does not read are refused at load, naming it."""
from __future__ import annotations

import pytest

from lmforge.bakeoff import PlanError, check_plan
from lmforge.objectives import get
from lmforge.objectives.keywords import objective_keywords


@pytest.mark.parametrize("change, field, said", [
    (lambda p: p["arms"][0].update(options={"ratio": 0.3}), "arms[0].options.ratio",
     "unknown mlm option ratio; did you mean rate? (known: rate, replace, whole_word)"),
    (lambda p: p["arms"][1].update(options={"foo": 1}), "arms[1].options.foo",
     "unknown rtd option foo"),
    (lambda p: p["arms"][0].update(pretrain=False, options={"rate": 0.2}), "arms[0].options",
     "only pretraining reads it, and this arm has pretrain: false"),
    (lambda p: p["arms"][0].update(pretrain=False, duplication=2), "arms[0].duplication", "only pretraining"),
    (lambda p: p["arms"][0].update(pretrain=False, train={"lr": 0.1}), "arms[0].train", "only pretraining"),
    (lambda p: p["arms"][0].update(objective="clm", preset="gpt2", duplication=2), "arms[0].duplication",
     "objective clm draws no corruption"),
    (lambda p: p["tasks"][0].update(n_per_label=50), "tasks[0].n_per_label",
     "source builtin does not read it (it reads n, task)"),
    (lambda p: p["tasks"].append({"name": "pos", "source": "gcide-pos", "n": 50}), "tasks[1].n",
     "source gcide-pos does not read it (it reads n_per_label)"),
    (lambda p: p["finetune"].update(num_beams=4), "finetune.num_beams",  # no bake-off task is seq2seq
     "an option of seq2seq tasks, and no task of the plan is one (its tasks: cls)"),
    (lambda p: p["finetune"].update(doc_stride=32), "finetune.doc_stride", "an option of qa tasks"),
    # the runner builds the earlier arm's model as it is: these overrides were silently never applied
    (lambda p: p["arms"][1].update(preset=None, continue_from="mlm"), "arms[1].overrides",
     "takes that arm's model as it is: no overrides"),
])
def test_a_field_no_run_reads_is_refused_naming_it(tiny_plan, change, field, said):
    change(tiny_plan)
    with pytest.raises(PlanError) as err:
        check_plan(tiny_plan, "p.yaml")
    assert str(err.value).startswith(f"p.yaml: {field}: ") and said in str(err.value), err.value


def test_what_the_runs_read_is_accepted(tiny_plan):
    tiny_plan["arms"][0].update(options={"rate": 0.2, "whole_word": True}, duplication=2)
    tiny_plan["arms"].append({"name": "floor", "objective": "mlm", "preset": "bert-tiny", "pretrain": False,
                              "overrides": tiny_plan["arms"][0]["overrides"]})
    plan = check_plan(tiny_plan, "p.yaml")
    assert plan.arms[0].options == {"rate": 0.2, "whole_word": True} and not plan.arms[2].pretrain


def test_an_objectives_keywords_are_its_builds_not_what_it_takes_from_the_tokenizer():
    assert objective_keywords(get("bilm")) == {"samples"}  # its build takes no **options
    assert objective_keywords(get("prefix-lm")) == set()  # a function of the model and tokenizer alone
    assert "ratio" in objective_keywords(get("rtd")) and "pad_id" not in objective_keywords(get("rtd"))


def test_a_fine_tuning_option_is_read_by_the_tasks_of_its_kind_and_refused_where_no_task_is_one(tiny_plan,
                                                                                                tmp_path):
    import json

    from lmforge.bakeoff import run_plan

    tiny_plan["finetune"].update(label_all=True)  # tagging's: the plan's one task is sentiment (cls)
    said = r"^p\.yaml: finetune\.label_all: an option of tagging tasks, and no task of the plan is one"
    with pytest.raises(PlanError, match=said):
        check_plan(tiny_plan, "p.yaml")
    # beside a tagging task the recipe serves both: the cls run was refused label_all after pretraining
    tiny_plan["tasks"].append({"name": "tags", "source": "builtin", "task": "tagging", "n": 40})
    tiny_plan.update(arms=[{**tiny_plan["arms"][0], "pretrain": False}], claims=[])
    rows = run_plan(check_plan(tiny_plan, "p.yaml"), tmp_path, log=lambda line: None)
    assert sorted(r["task"] for r in rows) == ["sentiment", "tags"]
    tagged = json.loads((tmp_path / "mlm" / "seed-0" / "tags" / "final" / "task.json").read_text())
    assert tagged["kind"] == "tagging" and tagged["label_all"] is True


def test_a_text_to_text_option_is_read_by_the_encoder_decoder_arms_alone(tiny_plan, tmp_path):
    import json

    from lmforge.bakeoff import run_plan

    tiny_plan["finetune"].update(prefix="sst2")  # every arm an encoder: no run would read it
    said = r"^p\.yaml: finetune\.prefix: read by encoder-decoder arms .* encoder$"
    with pytest.raises(PlanError, match=said):
        check_plan(tiny_plan, "p.yaml")
    t5 = {"name": "t5", "objective": "span-corruption", "preset": "t5-small", "pretrain": False,
          "overrides": {"n_layers": 1, "n_decoder_layers": 1, "d_model": 32, "n_heads": 2, "d_ff": 64}}
    tiny_plan.update(arms=[{**tiny_plan["arms"][0], "pretrain": False}, t5], claims=[])
    rows = run_plan(check_plan(tiny_plan, "p.yaml"), tmp_path, log=lambda line: None)
    assert sorted(r["arm"] for r in rows) == ["mlm", "t5"]  # the encoder arm's run was refused the prefix
    read = {arm: json.loads((tmp_path / arm / "seed-0" / "sentiment" / "final" / "task.json").read_text())
            for arm in ("mlm", "t5")}
    assert read["t5"]["prefix"] == "sst2" and read["mlm"].get("prefix") is None


@pytest.mark.parametrize("objective, preset", [("plm", "xlnet-base"), ("bilm", "elmo-small")])
def test_an_objective_without_a_flop_count_is_refused_by_the_plan_naming_it(tiny_plan, objective, preset):
    # said by check_plan, before a run builds the corpus and tokenizer, in the plan's words ('plm', not the
    # run's spec 'bakeoff.tiny.a')
    tiny_plan["arms"] = [{"name": "a", "objective": objective, "preset": preset}]
    tiny_plan["claims"] = []
    said = rf"^plan: arms\[0\]\.objective: no FLOP count for objective '{objective}'"
    with pytest.raises(PlanError, match=said):
        check_plan(tiny_plan)
    tiny_plan["arms"][0]["pretrain"] = False  # a baseline spends no FLOPs: nothing to count
    assert check_plan(tiny_plan).arms[0].objective == objective


@pytest.mark.parametrize("change, field, said", [
    # a number failed at the run as a TypeError traceback; "" read the working folder's files as the corpus
    (lambda p: p.update(corpus={"source": "files", "files": [1, 2]}), "corpus.files[0]",
     "a text file's path"),
    (lambda p: p.update(corpus={"source": "files", "files": [""]}), "corpus.files[0]", "a text file's path"),
    (lambda p: p.update(corpus={"source": "files", "files": ["a.txt"] * 10_001}), "corpus.files",
     "a list of 1 to 10000 text files"),
    (lambda p: p["corpus"].update(files=["a.txt"]), "corpus.files", "source builtin does not read it"),
    (lambda p: p.update(corpus={"source": "files", "files": ["a.txt"], "documents": 9}), "corpus.documents",
     "reads its files whole"),
    # JSON's "no" was read as true; pairs beside a sentences objective was never read
    (lambda p: p["arms"][0].update(examples={"cross_documents": "no"}), "arms[0].examples.cross_documents",
     "must be true or false"),
    (lambda p: p["arms"][0].update(examples={"pairs": "sentence-nsp"}), "arms[0].examples.pairs",
     "read by examples of kind pairs alone"),
    (lambda p: p["tasks"][0].update(task=["tagging"]), "tasks[0].task", "is not a built-in task"),  # a list
    (lambda p: p["tasks"][0].update(name="zzz"), "tasks[0].name", "'zzz' is not a built-in task"),
    (lambda p: p["arms"][0].update(name="a" * 300), "arms[0].name", "at most 100"),  # a directory's name
    (lambda p: p["arms"][0].update(preset=None, overrides={}, model=123), "arms[0].model", "got 123"),
])
def test_a_file_list_example_field_task_or_name_its_run_cannot_use_is_refused_naming_it(tiny_plan, change,
                                                                                          field, said):
    change(tiny_plan)
    with pytest.raises(PlanError) as err:
        check_plan(tiny_plan, "p.yaml")
    assert str(err.value).startswith(f"p.yaml: {field}: ") and said in str(err.value), err.value
    assert "\n" not in str(err.value) and len(str(err.value)) < 400


def test_a_files_corpus_and_the_example_fields_its_kind_reads_are_accepted(tiny_plan):
    tiny_plan["corpus"] = {"source": "files", "files": ["a.txt", "b.txt"]}
    tiny_plan["arms"][0].update(examples={"cross_documents": False})
    tiny_plan["tasks"].append({"name": "tags", "source": "builtin", "task": "tagging", "n": 40})
    plan = check_plan(tiny_plan, "p.yaml")
    assert plan.corpus["files"] == ["a.txt", "b.txt"] and plan.arms[0].examples == {"cross_documents": False}
