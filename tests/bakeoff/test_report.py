"""The report: mean +- sd per arm and task, and verdicts never beyond what the data shows."""
from __future__ import annotations

import json
import random

import pytest

from lmforge.bakeoff import check_plan
from lmforge.bakeoff.fingerprint import pretrain_key, schedule_key
from lmforge.bakeoff.report import REPRODUCED, REVERSED, UNRESOLVED, summarise, verdict, write_report
from lmforge.bakeoff.results import stamped


def rows(arm, values, task="sentiment"):
    return [{"arm": arm, "seed": s, "task": task, "metric": "accuracy", "value": v}
            for s, v in enumerate(values)]


def test_summary_is_mean_and_sample_sd_over_seeds():
    s = summarise(rows("a", [0.5, 0.7, 0.9]))[("a", "sentiment")]
    assert abs(s["mean"] - 0.7) < 1e-12 and abs(s["sd"] - 0.2) < 1e-12 and s["n"] == 3


def test_verdicts_need_the_sign_and_two_sd():
    s = summarise(rows("a", [0.80, 0.81, 0.82]) + rows("b", [0.60, 0.61, 0.62]) + rows("c", [0.5, 0.9, 0.7]))
    assert verdict(s[("a", "sentiment")], s[("b", "sentiment")])[0] == REPRODUCED
    assert verdict(s[("b", "sentiment")], s[("a", "sentiment")])[0] == REVERSED
    assert verdict(s[("c", "sentiment")], s[("a", "sentiment")])[0] == UNRESOLVED  # noise larger than the gap
    one = summarise(rows("d", [0.9]) + rows("e", [0.1]))
    assert verdict(one[("d", "sentiment")], one[("e", "sentiment")])[0] == UNRESOLVED  # one seed: no sd


@pytest.mark.parametrize("n", [2, 3])
def test_ties_get_a_verdict_at_most_one_time_in_twenty(n):
    # two arms of one true score, seed noise only: a fixed 2 sd called ~18 % of them at 2 seeds
    rng, called = random.Random(0), 0
    for _ in range(2000):
        s = summarise(rows("a", [rng.gauss(0.7, 0.02) for _ in range(n)]) +
                      rows("b", [rng.gauss(0.7, 0.02) for _ in range(n)]))
        called += verdict(s[("a", "sentiment")], s[("b", "sentiment")])[0] != UNRESOLVED
    assert called / 2000 <= 0.06


def test_arms_without_spread_are_told_apart_by_the_sign_and_a_tie_is_unresolved():
    s = summarise(rows("a", [0.7, 0.7]) + rows("b", [0.6, 0.6]) + rows("c", [0.7, 0.7]))
    assert verdict(s[("a", "sentiment")], s[("b", "sentiment")])[0] == REPRODUCED
    assert verdict(s[("a", "sentiment")], s[("c", "sentiment")])[0] == UNRESOLVED


def test_report_writes_table_claims_and_json(tmp_path, tiny_plan):
    tiny_plan["seeds"] = [0, 1, 2]
    plan = check_plan(tiny_plan)
    lines = rows("electra", [0.80, 0.81, 0.82]) + rows("mlm", [0.60, 0.61, 0.62])
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(stamped(r)) + "\n" for r in lines))
    text = write_report(plan, tmp_path).read_text()
    assert "| arm | sentiment (accuracy) |" in text  # what the numbers are
    assert "| electra | **0.8100** ± 0.0100 (n=3) |" in text and "| mlm | 0.6100 ± 0.0100 (n=3) |" in text
    assert "electra > mlm on sentiment" in text and REPRODUCED in text
    assert json.loads((tmp_path / "report.json").read_text())["claims"][0]["verdict"] == REPRODUCED


def test_a_single_seed_claim_says_it_has_no_spread(tmp_path, tiny_plan):
    plan = check_plan(tiny_plan)
    lines = rows("electra", [0.80]) + rows("mlm", [0.60])
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(stamped(r)) + "\n" for r in lines))
    text = write_report(plan, tmp_path).read_text()
    assert "nan" not in text and "a single seed: no spread" in text and UNRESOLVED in text


def test_a_nan_result_is_no_best_and_its_claim_says_so(tmp_path, tiny_plan):
    """A NaN metric (the first arm's): the other arm's mean is still the task's best, in bold, whatever the
    arms' order, and the claim says it has no Δ rather than 'Δ = +nan'."""
    tiny_plan["seeds"] = [0, 1]
    lines = rows("mlm", [float("nan"), 0.6]) + rows("electra", [0.8, 0.9])
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(stamped(r)) + "\n" for r in lines))
    text = write_report(check_plan(tiny_plan), tmp_path).read_text()
    assert "| electra | **0.8500** ± 0.0707 (n=2) |" in text
    assert "+nan" not in text and "a result is not a number (NaN), no Δ → **not resolved" in text


def test_the_table_averages_the_seeds_its_header_names(tmp_path, tiny_plan):
    """--seeds 0 --report after a 3-seed run: the header says seeds [0], so the table is seed 0's (n=1),
    and the other seeds' results are said to be left out, not averaged in silently."""
    tiny_plan["seeds"] = [0]
    plan = check_plan(tiny_plan)
    lines = rows("electra", [0.80, 0.90, 1.00]) + rows("mlm", [0.60, 0.70, 0.80])
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(stamped(r)) + "\n" for r in lines))
    text = write_report(plan, tmp_path).read_text()
    assert "seeds [0];" in text
    # one seed: no spread to show (a "± 0.0000" read as a measured zero spread)
    assert "| electra | **0.8000** (n=1) |" in text and "| mlm | 0.6000 (n=1) |" in text
    assert "4 result(s) of seeds [1, 2] left out" in text
    summary = json.loads((tmp_path / "report.json").read_text())["summary"]
    assert {s["n"] for s in summary} == {1}


def _pretrain_run(out, plan, arm: str, records: list, stamp: str | None = None) -> None:
    """A pretraining run directory of `arm` at seed 0: its metrics and the fingerprint it was started for
    (the plan's unless `stamp`)."""
    folder = out / arm / "seed-0" / "pretrain"
    folder.mkdir(parents=True)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    key = stamp or pretrain_key(plan, plan.arm(arm), 0)
    (folder / "plan.json").write_text(json.dumps({"fingerprint": key}))


def test_a_changed_plans_report_shows_no_schedule_or_curve_of_the_old_one(tmp_path, tiny_plan):
    """--report after the budget changed, before a rerun: the steps and FLOPs counted for the old budget are
    not shown as this plan's ("-50 % of the budget"), nor the old runs' curves."""
    old = check_plan(tiny_plan)
    schedule = {a.name: {"steps": 10, "flops_per_step": 1.2e8, "flops": 1.2e9, "by_network": {},
                         "budget": 1.2e9, "fingerprint": schedule_key(old, a)} for a in old.arms}
    schedule["electra"]["shares"] = {"padded": 0.96, "tokens": 0.78, "maskable": 0.7}  # what a run measured
    (tmp_path / "schedule.json").write_text(json.dumps(schedule))
    _pretrain_run(tmp_path, old, "mlm", [{"step": s, "loss": 9 - s / 10} for s in range(1, 11)])
    text = write_report(old, tmp_path).read_text()
    assert "- mlm: 10 steps x 1.2e+08 = 1.2e+09 FLOPs (+0.00 % of the budget)" in text
    assert "(+0.00 % of the budget; examples padded to 0.96, maskable tokens 0.70 of max_len)" in text
    assert (tmp_path / "learning_curves.png").is_file()
    assert set(json.loads((tmp_path / "report.json").read_text())["schedules"]) == {"mlm", "electra"}
    (tmp_path / "learning_curves.png").unlink()
    tiny_plan["budget"] = 8e8
    text = write_report(check_plan(tiny_plan), tmp_path).read_text()
    assert "% of the budget" not in text and text.count("not counted for this version of the plan") == 2
    data = json.loads((tmp_path / "report.json").read_text())  # what it compares, as the markdown says it
    assert data["budget"] == 8e8 and data["seeds"] == [0] and data["schedules"] == {}
    assert not (tmp_path / "learning_curves.png").exists()


def _curves_axes(tmp_path, monkeypatch, tiny_plan, losses: dict, flops_per_step: dict):
    """The learning curves' axes for the given arm -> metrics records (caught before saving)."""
    from lmforge.bakeoff import report

    caught, plan = [], check_plan(tiny_plan)
    monkeypatch.setattr(report, "atomic_savefig", lambda fig, path, dpi=None: caught.append(fig.axes[0]))
    for arm, records in losses.items():
        _pretrain_run(tmp_path, plan, arm, records)
    schedules = {arm: {"flops_per_step": f} for arm, f in flops_per_step.items()}
    assert report.curves(plan, tmp_path, schedules) is not None
    return caught[0]


def test_short_curves_are_visible_on_a_labelled_linear_axis_and_nan_is_said(tmp_path, monkeypatch, tiny_plan):
    """One logged step an arm, FLOPs within one decade: markers (a one-point line draws nothing), a
    linear axis (a log axis inside a decade had no labelled tick), the NaN said rather than dropped."""
    ax = _curves_axes(tmp_path, monkeypatch, tiny_plan,
                      {"mlm": [{"step": 3, "loss": 5.7}], "electra": [{"step": 1, "loss": 9.0},
                                                                      {"step": 2, "loss": float("nan")}]},
                      {"mlm": 1.3e8, "electra": 1.9e8})
    assert all(line.get_marker() == "o" for line in ax.lines) and ax.get_xscale() == "linear"
    assert "1 non-finite loss value(s) not drawn" in " ".join(t.get_text() for t in ax.texts)
    assert "pretraining loss" in ax.get_title() and ax.get_xlabel() == "training FLOPs"


def test_curves_spanning_decades_are_drawn_on_a_log_axis(tmp_path, monkeypatch, tiny_plan):
    losses = {"mlm": [{"step": s, "loss": 9 - s / 10} for s in range(1, 51)]}
    ax = _curves_axes(tmp_path, monkeypatch, tiny_plan, losses, {"mlm": 1e8})
    assert ax.get_xscale() == "log" and ax.lines[0].get_marker() in ("None", "")


def test_the_report_says_the_hardware_the_sd_and_how_flops_were_counted(tmp_path, tiny_plan):
    """report.md and report.json name the devices the rows ran on, the sd's definition (n - 1) and what the
    counted FLOPs count; a single seed's sd is null in report.json, not 0 (no spread was measured)."""
    plan = check_plan(tiny_plan)
    gpu = {"pretrain": "NVIDIA H200 (cuda), torch 2.5", "finetune": "Xeon (cpu, 2 threads), torch 2.5"}
    lines = [dict(r, hardware=gpu) for r in rows("electra", [0.80]) + rows("mlm", [0.60])]
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(stamped(r)) + "\n" for r in lines))
    text = write_report(plan, tmp_path).read_text()
    data = json.loads((tmp_path / "report.json").read_text())
    assert data["hardware"] == sorted(gpu.values()) and all(h in text for h in gpu.values())
    assert "n - 1" in data["sd"] and "n - 1" in text
    assert "3 x" in data["flops"] and "maskable tokens" in text and "padded length" in data["flops"]
    assert [s["sd"] for s in data["summary"]] == [None, None]
    assert data["budget"] == plan.budget and data["seeds"] == [0]
