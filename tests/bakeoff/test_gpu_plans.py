"""The GPU bake-off plans: the CPU plans' arms and claims at GPU scale, bf16, their dry runs on the CPU."""
import re

import pytest

from lmforge.bakeoff import load_plan
from lmforge.bakeoff.shipped import SHIPPED
from lmforge.cli import main

GPU_PLANS = {"electra-gpu": "electra", "roberta-gpu": "roberta", "t5-gpu": "t5"}


@pytest.mark.parametrize("name", sorted(GPU_PLANS))
def test_gpu_plan_keeps_the_cpu_plans_arms_and_claims_and_states_its_costs(name):
    gpu, cpu = load_plan(name), load_plan(GPU_PLANS[name])
    assert [(a.name, a.objective, a.options, a.pretrain) for a in gpu.arms] == \
        [(a.name, a.objective, a.options, a.pretrain) for a in cpu.arms]
    assert gpu.claims == cpu.claims and len(gpu.seeds) == 3  # the same verdicts, 3 seeds
    assert gpu.budget >= 30 * cpu.budget  # the scale the CPU plans lack
    assert gpu.pretrain["precision"] == "bf16" and gpu.pretrain["max_len"] >= 128
    header = (SHIPPED / f"{name}.yaml").read_text().split("\nname:")[0]
    for stated in (r"FLOPs per\s+(#\s+)?arm", r"M\s+(#\s+)?tokens", r"H200", r"8 min"):
        assert re.search(stated, header), (name, stated)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(GPU_PLANS))
def test_gpu_plan_dry_run_spends_its_budget_and_trains_nothing(name, tmp_path, capsys):
    out = tmp_path / name
    assert main(["bakeoff", "--plan", name, "--out", str(out), "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    plan = load_plan(name)
    assert [line.split(":")[0] for line in lines] == [a.name for a in plan.arms]
    for line in lines:
        found = re.search(r"= (\S+) \(([-+][\d.]+) % of the budget", line)
        assert found or "no pretraining" in line, line
        if found:
            assert abs(float(found.group(2))) <= 2.0, line
    assert not any((out / a.name).exists() for a in plan.arms)
