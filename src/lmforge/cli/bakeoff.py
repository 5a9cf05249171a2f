"""`lmforge bakeoff`: pretraining objectives compared at equal compute (lmforge.bakeoff).

    lmforge bakeoff --plan electra --out runs/electra            # a shipped plan, by name
    lmforge bakeoff --plan my-plan.yaml --out runs/mine --dry-run # steps and FLOPs per arm only
    lmforge bakeoff --plan electra --out runs/electra --report   # the report of what has run

A rerun with the same --out resumes: finished (arm, seed, task) results of the plan as it is are kept,
an interrupted pretraining run continues from its checkpoint; what a changed plan changed (an arm, the
budget, corpus, recipe or a task) runs again, and a line says so; a corpus file edited since the run first
read it is refused (restore it, or use a fresh --out): the finished arms were trained on it as it was. Every
size in a plan is bounded.
The shipped plans are named under --plan below.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from lmforge.cli.common import UsageError, refuse_overwrite


def _plan(args):
    from lmforge.bakeoff import PlanError, load_plan, shipped_plans

    try:
        return load_plan(args.plan)
    except PlanError as err:
        hint = "" if args.plan.endswith((".yaml", ".yml", ".json")) else \
            f" (shipped plans: {', '.join(shipped_plans())})"
        raise UsageError(f"{err}{hint}") from None


def _seeds(text: str | None, plan):
    if text is None:
        return plan
    try:
        seeds = [int(s) for s in text.split(",")]
    except ValueError:
        raise UsageError(f"--seeds: expected integers separated by commas, got {text!r}") from None
    from dataclasses import replace

    from lmforge.bakeoff.plan import check_seeds

    try:
        return replace(plan, seeds=check_seeds(seeds, "--seeds"))
    except ValueError as err:
        raise UsageError(str(err)) from None


def out_names(plan) -> tuple:
    """The names a bake-off of `plan` writes at the top of its --out: its files and folders (bakeoff.layout,
    where the runner and the report take them from), and a folder for each arm's runs."""
    from lmforge.bakeoff.layout import WRITTEN

    return (*WRITTEN, *(arm.name for arm in plan.arms))


def plan_inputs(plan) -> tuple:
    """(field, paths) of what a plan reads from disk besides itself: its corpus files (the plan's and each
    arm's own) and each arm's model (a checkpoint folder; an installed model's name is none on disk)."""
    corpora = [plan.corpus, *(arm.corpus for arm in plan.arms if arm.corpus)]
    files = [file for corpus in corpora if corpus.get("source") == "files" for file in corpus["files"]]
    return ("corpus.files", files), ("arms.model", [arm.model for arm in plan.arms if arm.model])


def cmd_bakeoff(args) -> None:
    """Run (or resume) a plan under --out, then write its report."""
    from lmforge.bakeoff import PlanError, plan_file
    from lmforge.bakeoff.layout import RESULTS, SCHEDULE
    from lmforge.bakeoff.report import write_report
    from lmforge.bakeoff.runner import BakeOff

    # under torchrun main has refused it (utils.ranks.one_process): each rank would run every arm, at
    # world-size x the FLOPs its budgets count
    plan = _seeds(args.seeds, _plan(args))
    # the file read: a shipped plan's name is no path (--plan electra --out electra resumes its run); one
    # kept in --out under a name the run writes (report.json, an arm's folder) would be written over
    refuse_overwrite(args.out, ("--plan", plan_file(args.plan)), *plan_inputs(plan), writes=out_names(plan))
    if args.report and not any(Path(args.out, name).exists() for name in (SCHEDULE, RESULTS)):
        raise UsageError(f"--out {args.out}: no bake-off has run there (no {SCHEDULE}, no {RESULTS}): run "
                         "the plan (or --dry-run) first")  # a report of nothing, in a folder it made
    if not args.report:
        try:
            run = BakeOff(plan, args.out)
        except PlanError as err:
            raise UsageError(str(err)) from None
        for name, s in run.schedules.items():
            print(f"{name}: {s.steps} steps x {s.flops_per_step:.3g} FLOPs = {s.flops:.4g} "
                  f"({100 * (s.flops / plan.budget - 1):+.2f} % of the budget {plan.budget:.3g})" if s.steps
                  else f"{name}: no pretraining of its own (a baseline)")
        if args.dry_run:
            return
        run.run()
    print(f"wrote {write_report(plan, args.out)}")


def add_parsers(sub) -> None:
    """Add bakeoff to the main parser."""
    from lmforge.bakeoff import shipped_plans

    p = sub.add_parser("bakeoff", help="compare pretraining objectives at equal compute (a plan of arms)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--plan", required=True,
                   help=f"a YAML/JSON plan, or a shipped plan's name: {', '.join(shipped_plans()) or 'none'}")
    p.add_argument("--out", required=True, help="the run's directory (a rerun resumes it)")
    p.add_argument("--seeds", help="comma-separated seeds instead of the plan's (e.g. 0 for a first look)")
    only = p.add_mutually_exclusive_group()  # together, --report ran and --dry-run was dropped unsaid
    only.add_argument("--dry-run", dest="dry_run", action="store_true",
                      help="prepare corpus, tokenizer and tasks, print each arm's steps and FLOPs, "
                           "train nothing")
    only.add_argument("--report", action="store_true", help="only write the report of the results so far")
    p.set_defaults(func=cmd_bakeoff)
