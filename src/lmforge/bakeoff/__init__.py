"""The bake-off: pretraining objectives compared at equal compute (training FLOPs) on real text.

`run_plan(plan, out)` pretrains every arm of a plan (plan.py) for the steps its FLOP count
(flops.py) allows within the plan's budget, fine-tunes each on every downstream task with one
recipe (runner.py), and `write_report(out)` tabulates the results and judges the plan's claims
(report.py). The corpus is real dictionary text from Debian packages (corpus.py).
"""
from __future__ import annotations

from lmforge.bakeoff.plan import Plan, PlanError, check_plan, load_plan
from lmforge.bakeoff.shipped import plan_file, shipped_plans

__all__ = ["Plan", "PlanError", "check_plan", "load_plan", "plan_file", "shipped_plans", "run_plan"]


def run_plan(plan: Plan, out, log=print) -> list:
    """Run (or resume) every arm x seed x task of `plan` under `out`; returns the result rows."""
    from lmforge.bakeoff.runner import BakeOff

    return BakeOff(plan, out, log=log).run()
