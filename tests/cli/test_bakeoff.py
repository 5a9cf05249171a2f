"""`lmforge bakeoff`: a bad plan is one line and exit 2; --dry-run prints each arm's steps and FLOPs."""
from __future__ import annotations

import json

import pytest

from lmforge.cli import main
from tests.bakeoff.conftest import TINY


def test_a_bad_plan_exits_2_with_one_line_naming_the_field(tmp_path, capsys):
    plan = json.loads(json.dumps(TINY))
    plan["arms"][0]["objective"] = "nonsense"
    (tmp_path / "p.json").write_text(json.dumps(plan))
    assert main(["bakeoff", "--plan", str(tmp_path / "p.json"), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "arms[0].objective" in err
    assert main(["bakeoff", "--plan", "no-such-plan", "--out", str(tmp_path / "o")]) == 2
    assert "shipped plans: " in capsys.readouterr().err


def test_dry_run_prints_steps_within_two_percent_and_trains_nothing(tmp_path, capsys):
    (tmp_path / "p.json").write_text(json.dumps(TINY))
    assert main(["bakeoff", "--plan", str(tmp_path / "p.json"), "--out", str(tmp_path / "o"),
                 "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == ["mlm", "electra"]
    schedule = json.loads((tmp_path / "o" / "schedule.json").read_text())
    assert all(abs(s["flops"] - s["budget"]) <= 0.02 * s["budget"] for s in schedule.values())
    assert not (tmp_path / "o" / "mlm").exists()


def test_a_dry_run_of_an_unbounded_plan_is_refused_at_once_naming_the_bound(tmp_path, capsys):
    import yaml

    for field, text in (("corpus.documents", "documents: 1000000000"), ("budget", "budget: .inf"),
                        ("budget", "budget: .nan")):
        plan = yaml.safe_dump(json.loads(json.dumps(TINY)))
        plan = plan.replace("documents: 120", text) if field != "budget" else \
            plan.replace(f"budget: {float(TINY['budget'])}", text)
        (tmp_path / "p.yaml").write_text(plan)
        assert main(["bakeoff", "--plan", str(tmp_path / "p.yaml"), "--out", str(tmp_path / "o"),
                     "--dry-run"]) == 2
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and field in err and "the bound on" in err, err
    assert not (tmp_path / "o").exists()  # refused before anything was prepared


def test_a_bake_off_under_torchrun_is_refused_before_any_work(tmp_path, capsys, monkeypatch):
    """Every rank would run every arm (each step world-size times the counted FLOPs) and write the same
    results; the budgets count one process."""
    (tmp_path / "p.json").write_text(json.dumps(TINY))
    monkeypatch.setenv("WORLD_SIZE", "2")
    args = ["bakeoff", "--plan", str(tmp_path / "p.json"), "--out", str(tmp_path / "o"), "--dry-run"]
    assert main(args) == 2
    assert "run it without torchrun" in capsys.readouterr().err and not (tmp_path / "o").exists()


def test_a_report_of_a_folder_where_nothing_ran_is_refused_not_written(tmp_path, capsys):
    """`--report` on a new --out made the folder and wrote a report of "not run" rows, exit 0."""
    (tmp_path / "p.json").write_text(json.dumps(TINY))
    args = ["bakeoff", "--plan", str(tmp_path / "p.json"), "--out", str(tmp_path / "o"), "--report"]
    assert main(args) == 2
    assert "no bake-off has run there" in capsys.readouterr().err and not (tmp_path / "o").exists()


def test_dry_run_and_report_together_are_refused_naming_both(tmp_path, capsys):
    """--report used to win silently: the dry run asked for was never printed."""
    (tmp_path / "p.json").write_text(json.dumps(TINY))
    args = ["bakeoff", "--plan", str(tmp_path / "p.json"), "--out", str(tmp_path / "o"),
            "--dry-run", "--report"]
    with pytest.raises(SystemExit) as ended:
        main(args)
    assert ended.value.code == 2
    err = capsys.readouterr().err
    assert "--report" in err and "--dry-run" in err and not (tmp_path / "o").exists()


def test_a_shipped_plan_s_name_is_no_path_so_an_out_of_that_name_resumes(tmp_path, capsys, monkeypatch):
    """--plan tiny --out tiny, run again in the same folder: the plan read is the shipped file, not the
    run's folder of that name (it was refused as "would write over the input --plan")."""
    import yaml

    from lmforge.bakeoff import shipped

    plans = tmp_path / "plans"
    plans.mkdir()
    (plans / "tiny.yaml").write_text(yaml.safe_dump(json.loads(json.dumps(TINY))))
    monkeypatch.setattr(shipped, "SHIPPED", plans)
    monkeypatch.chdir(tmp_path)
    for _ in range(2):
        assert main(["bakeoff", "--plan", "tiny", "--out", "tiny", "--dry-run"]) == 0, capsys.readouterr().err


@pytest.mark.parametrize("name", ["report.json", "schedule.json", "built.json", "results.jsonl",
                                  "mlm/plan.json"])
def test_a_plan_kept_in_out_under_a_name_the_run_writes_is_refused_and_left_as_it_was(tmp_path, capsys, name):
    """--plan o/report.json --out o: the run wrote its report over the plan it read (exit 0); refused now,
    exit 2 with one line naming both, before anything is written."""
    plan = tmp_path / "o" / name
    plan.parent.mkdir(parents=True)
    plan.write_text(json.dumps(TINY))
    assert main(["bakeoff", "--plan", str(plan), "--out", str(tmp_path / "o"), "--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--plan" in err and "--out" in err, err
    assert json.loads(plan.read_text()) == TINY
    assert sorted(p.name for p in (tmp_path / "o").rglob("*")) == sorted(set(name.split("/"))), "written"


def test_a_plan_kept_in_out_under_a_name_of_its_own_still_runs(tmp_path, capsys):
    """A plan beside its run (o/plan.json), a name the run never writes, is read as before."""
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "plan.json").write_text(json.dumps(TINY))
    args = ["bakeoff", "--plan", str(tmp_path / "o" / "plan.json"), "--out", str(tmp_path / "o"), "--dry-run"]
    assert main(args) == 0, capsys.readouterr().err
    assert json.loads((tmp_path / "o" / "plan.json").read_text()) == TINY


def test_a_corpus_file_of_the_plan_in_out_under_a_name_the_run_writes_is_refused(tmp_path, capsys):
    """corpus {source: files, files: [o/report.md]}: the run's report was written over the corpus it read
    (exit 0); refused now, exit 2 with one line naming the plan's field, the corpus left as it was."""
    corpus = tmp_path / "o" / "report.md"
    corpus.parent.mkdir()
    corpus.write_text("The fox jumps over the dog.\n\nThe dog sleeps in the sun.\n")
    plan = {**json.loads(json.dumps(TINY)), "corpus": {"source": "files", "files": [str(corpus)]}}
    (tmp_path / "p.json").write_text(json.dumps(plan))
    args = ["bakeoff", "--plan", str(tmp_path / "p.json"), "--out", str(tmp_path / "o"), "--dry-run"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "corpus.files" in err and str(corpus) in err, err
    assert corpus.read_text().startswith("The fox") and [p.name for p in (tmp_path / "o").iterdir()] == [
        "report.md"]


def _files_plan(tmp_path, *files) -> list:
    """The tiny plan on corpus {source: files, files}, written to p.json; its dry run's arguments."""
    plan = {**json.loads(json.dumps(TINY)), "corpus": {"source": "files", "files": [str(f) for f in files]}}
    (tmp_path / "p.json").write_text(json.dumps(plan))
    return ["bakeoff", "--plan", str(tmp_path / "p.json"), "--out", str(tmp_path / "o"), "--dry-run"]


TEXT = "".join(f"The fox {i} jumps over the dog. The dog sleeps in the sun {i}.\n\n" for i in range(60))


@pytest.mark.parametrize("n_files", [1, 2])
def test_a_corpus_file_changed_since_the_run_read_it_is_refused_naming_it(tmp_path, capsys, n_files):
    """A single corpus file edited between two runs of one --out: 'done already' for the finished arms while
    the tokenizer was trained again on the new text (two corpora in one table, unsaid); several: the old copy
    read, the edit ignored unsaid. Refused now, exit 2 in one line naming the file and what to do, and run
    again once the file is restored."""
    files = [tmp_path / f"c{i}.txt" for i in range(n_files)]
    for f in files:
        f.write_text(TEXT)
    args = _files_plan(tmp_path, *files)
    assert main(args) == 0, capsys.readouterr().err
    files[-1].write_text(TEXT.replace("fox", "cat"))
    capsys.readouterr()
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and str(files[-1]) in err and "--out" in err and "restore" in err, err
    files[-1].write_text(TEXT)
    assert main(args) == 0, capsys.readouterr().err


def test_several_corpus_files_are_read_as_one_is_a_missing_one_named(tmp_path, capsys):
    """Of several files, one not UTF-8 was 'error: 'utf-8' codec can't decode byte 0xff' naming no file (one
    file alone: its bad piece skipped with a warning naming it) and a missing one a bare [Errno 2]: now the
    reader's rule for both, and a missing file named in one line, exit 2."""
    good, bad = tmp_path / "good.txt", tmp_path / "bad.txt"
    good.write_text(TEXT)
    bad.write_bytes(TEXT.encode() + b"caf\xff au lait is not UTF-8.\n")
    with pytest.warns(UserWarning, match=str(bad)):
        assert main(_files_plan(tmp_path, good, bad)) == 0, capsys.readouterr().err
    missing = tmp_path / "gone.txt"
    assert main(_files_plan(tmp_path, good, missing)) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and str(missing) in err and "no such file" in err, err


def test_the_names_refused_in_out_are_those_a_run_and_its_report_write(tmp_path, capsys, monkeypatch):
    """out_names restated the runner's and the report's file names as literals, free to drift from what they
    write; they share bakeoff.layout now. A whole run (training faked) and its report leave at the top of
    --out exactly the names a plan or an input there is refused under: none written unrefused, none stale."""
    from lmforge.bakeoff import runner
    from lmforge.bakeoff.plan import check_plan
    from lmforge.cli.bakeoff import out_names

    def fake_pretrain(objective, out, *rest, **options):  # a run directory with a learning curve to draw
        (out / "final").mkdir(parents=True, exist_ok=True)
        (out / "metrics.jsonl").write_text('{"step": 1, "loss": 5.0}\n{"step": 2, "loss": 4.0}\n')

    def fake_finetune(self, arm, seed, task, model):
        return {"plan": self.plan.name, "arm": arm.name, "seed": seed, "task": task, "metric": "accuracy",
                "value": 0.5, "metrics": {"accuracy": 0.5}}

    monkeypatch.setattr(runner, "pretrain", fake_pretrain)
    monkeypatch.setattr(runner.BakeOff, "finetune", fake_finetune)
    (tmp_path / "p.json").write_text(json.dumps(TINY))
    assert main(["bakeoff", "--plan", str(tmp_path / "p.json"), "--out", str(tmp_path / "o")]) == 0, \
        capsys.readouterr().err
    written = {path.name for path in (tmp_path / "o").iterdir()}
    refused = set(out_names(check_plan(json.loads(json.dumps(TINY)))))
    assert written <= refused, f"written, not refused: {written - refused}"
    assert refused <= written, f"refused, never written: {refused - written}"
