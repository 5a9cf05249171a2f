"""A finished unit of a bake-off is kept only under the fingerprint of what made it."""
from __future__ import annotations

from lmforge.bakeoff import check_plan, fingerprint


def test_a_pretraining_counted_under_another_flop_counting_is_not_kept(tiny_plan, monkeypatch):
    """A new count buys an arm other steps for the same budget: a pretraining stamped under the old one
    (and the results fine-tuned from it) had been kept, its steps counted the old way."""
    plan = check_plan(tiny_plan)
    mlm = plan.arm("mlm")
    now = fingerprint.pretrain_key(plan, mlm, 0)
    result = fingerprint.result_key(plan, mlm, 0, plan.tasks[0])
    assert now == fingerprint.pretrain_key(plan, mlm, 0)  # the same plan, the same stamp
    monkeypatch.setattr(fingerprint, "COUNTING", fingerprint.COUNTING - 1)
    assert fingerprint.pretrain_key(plan, mlm, 0) != now
    assert fingerprint.result_key(plan, mlm, 0, plan.tasks[0]) != result
