"""Plans: a valid plan loads; every mistake is one line naming the field; shipped plans are valid."""
from __future__ import annotations

import json

import pytest

from lmforge.bakeoff import PlanError, check_plan, load_plan, shipped_plans


def test_a_valid_plan_loads_with_defaults(tiny_plan):
    plan = check_plan(tiny_plan)
    assert [a.name for a in plan.arms] == ["mlm", "electra"]
    assert plan.arm("electra").options == {"ratio": 0.5}
    assert plan.seeds == (0,) and plan.budget == 1.2e9
    assert plan.claims[0].better == "electra"


@pytest.mark.parametrize("change, field", [
    (lambda p: p["arms"][1].update(objective="nonsense"), "arms[1].objective"),
    (lambda p: p["arms"][0].update(preset="no-such-preset"), "arms[0].preset"),
    (lambda p: p["arms"][0].update(speed=3), "arms[0]: unknown field speed"),
    (lambda p: p.update(budget=-1), "budget"),
    (lambda p: p.update(seeds=[0, 0]), "seeds"),
    (lambda p: p["claims"][0].update(better="gpt"), "claims[0].better"),
    (lambda p: p["claims"][0].update(task="squad"), "claims[0].task"),
    (lambda p: p["corpus"].update(source="wikipedia"), "corpus.source"),
    (lambda p: p["pretrain"].update(steps=10), "pretrain.steps"),
    (lambda p: p["pretrain"].update(lr=-1), "pretrain"),
    (lambda p: p["finetune"].update(patience=-2), "finetune"),
    (lambda p: p["tasks"][0].update(source="glue"), "tasks[0].source"),
    (lambda p: p["arms"].append(dict(p["arms"][0])), "arms[2].name"),
    (lambda p: p["arms"][0].update(continue_from="electra"), "arms[0].preset"),
    (lambda p: p["arms"][0].update(objective="t5"), "arms[0].objective"),
    (lambda p: p["arms"][0].update(pretrain="no"), "arms[0].pretrain"),
    (lambda p: p["arms"][0].update(model="some/dir", preset=None), "arms[0].overrides"),
    # of another kind: 'unhashable type', or a traceback counting the arm's FLOPs
    (lambda p: p["claims"][0].update(better=["electra"]), "claims[0].better"),
    (lambda p: p["claims"][0].update(task={}), "claims[0].task"),
    (lambda p: p["tokenizer"].update(family=["bert"]), "tokenizer.family"),
    (lambda p: p["arms"][0].update(options={"rate": [0.15]}), "arms[0].options.rate: must be a finite"),
    (lambda p: p["arms"][0].update(options={"rate": float("nan")}), "arms[0].options.rate"),
    (lambda p: p["arms"][0].update(options={"whole_word": "yes"}), "arms[0].options.whole_word: must be"),
    (lambda p: p["arms"][0].update(options={"replace": [0.8, "x", 0.1]}), "arms[0].options.replace"),
    # a preset that exists with an override it refuses: the override named, not the preset
    (lambda p: p["arms"][0]["overrides"].update(n_layers=0), "arms[0].overrides: n_layers must be"),
    (lambda p: p["arms"][0]["overrides"].update(speed=1), "arms[0].overrides: unknown config field"),
    (lambda p: p["arms"][0].update(objective=["mlm"]), "arms[0].objective: must be an objective's name"),
    (lambda p: p["arms"][0].update(examples={"kind": "zzz"}), "arms[0].examples: example kind 'zzz'"),
])
def test_each_mistake_is_one_line_naming_its_field(tiny_plan, change, field):
    change(tiny_plan)
    with pytest.raises(PlanError) as err:
        check_plan(tiny_plan, "my.yaml")
    message = str(err.value)
    assert "\n" not in message and message.startswith("my.yaml") and field in message, message


def test_a_plan_file_reads_as_yaml_or_json(tmp_path, tiny_plan):
    (tmp_path / "p.json").write_text(json.dumps(tiny_plan))
    assert load_plan(tmp_path / "p.json").name == "tiny"
    (tmp_path / "bad.yaml").write_text("arms: [unclosed")
    with pytest.raises(PlanError, match="cannot read plan"):
        load_plan(tmp_path / "bad.yaml")


def test_shipped_plans_are_valid_and_state_claims():
    assert {"electra", "roberta", "t5", "spanbert", "domain"} <= set(shipped_plans())
    for name in shipped_plans():
        plan = load_plan(name)
        assert plan.claims, name
        assert len(plan.seeds) == 3, name


def test_yaml_exponents_without_a_dot_read_as_numbers(tmp_path, tiny_plan):
    import yaml

    text = yaml.safe_dump(tiny_plan).replace("budget: 1200000000.0", "budget: 1.2e9")
    (tmp_path / "p.yaml").write_text(text.replace("lr: 0.001", "lr: 1e-3"))
    plan = load_plan(tmp_path / "p.yaml")
    assert plan.budget == 1.2e9 and plan.pretrain["lr"] == 1e-3


def test_every_shipped_arm_builds_its_objective():
    """Each arm's objective, options and example format fit its preset and the plan's tokenizer."""
    from lmforge.bakeoff.runner import arm_config, arm_spec
    from lmforge.data.synthetic import documents
    from lmforge.model import from_config
    from lmforge.train.pretrain import special_token_ids
    from lmforge.train.tokenizer_run import default_tokenizer

    docs, tokenizers = list(documents(60, seed=0)), {}
    for name in shipped_plans():
        plan = load_plan(name)
        family = plan.tokenizer["family"]
        tok = tokenizers.setdefault(family, default_tokenizer(family, docs, 300))
        for arm in plan.arms:
            cfg = arm_config(plan, arm, tok.vocab_size)
            if cfg.architecture != "encoder":
                cfg = cfg.replace(**special_token_ids(tok, cfg.architecture))
            assert arm_spec(plan, arm).make(from_config(cfg), tok) is not None, (name, arm.name)


@pytest.mark.parametrize("change, field", [
    (lambda p: p["tasks"].append(dict(p["tasks"][0])), "tasks[1].name"),
    (lambda p: p["claims"][0].update(worse="electra"), "claims[0].worse"),
])
def test_a_task_named_twice_or_an_arm_compared_with_itself_is_refused(tiny_plan, change, field):
    change(tiny_plan)
    with pytest.raises(PlanError, match=r"names two tasks|with itself") as err:
        check_plan(tiny_plan, "my.yaml")
    assert field in str(err.value)


@pytest.mark.parametrize("change, field", [
    (lambda p: p["corpus"].update(documents=10 ** 9), "corpus.documents"),
    (lambda p: p["corpus"].update(documents=0), "corpus.documents"),
    (lambda p: p.update(budget=float("inf")), "budget"),
    (lambda p: p.update(budget=float("nan")), "budget"),
    (lambda p: p.update(budget=1e30), "budget"),
    (lambda p: p.update(seeds=list(range(1000))), "seeds"),
    (lambda p: p["tasks"][0].update(n=10 ** 9), "tasks[0].n"),
    (lambda p: p["tasks"][0].update(n=9), "tasks[0].n"),
    (lambda p: p["tasks"][0].update(n_per_label=1), "tasks[0].n_per_label"),
    (lambda p: p["tokenizer"].update(vocab_size=10 ** 9), "tokenizer.vocab_size"),
    (lambda p: p["tokenizer"].update(family="words", vocab_size=4), "tokenizer.vocab_size"),
    (lambda p: p.update(arms=p["arms"] * 40), "arms"),
])
def test_every_size_of_the_plans_own_is_bounded_both_ways_naming_the_bound(tiny_plan, change, field):
    """The plan's own sizes (not a run's options: test_plan_options.py) name the plan's bound."""
    change(tiny_plan)
    with pytest.raises(PlanError) as err:
        check_plan(tiny_plan, "my.yaml")
    message = str(err.value)
    assert "\n" not in message and field in message and "the bound on" in message, message


def test_a_budget_that_buys_more_steps_than_the_bound_is_refused(tmp_path, tiny_plan):
    from lmforge.bakeoff.runner import schedules

    tiny_plan["budget"] = 1e21
    with pytest.raises(PlanError, match="over the bound on steps"):
        schedules(check_plan(tiny_plan), vocab_size=300)


def test_the_plans_bounds_on_a_builtin_task_and_a_tokenizer_are_the_commands():
    """A built-in task's records and the tokenizer's size: one bound for the plan and the commands."""
    from lmforge.bakeoff.plan import BOUNDS
    from lmforge.config.model import MAX_VOCAB
    from lmforge.tasks.formats import BUILTIN_SIZE, builtin
    from lmforge.tokenizer.train import TokenizerOptions

    assert BOUNDS["n"] == BUILTIN_SIZE and BOUNDS["vocab_size"][1] == MAX_VOCAB
    assert TokenizerOptions(vocab_size=MAX_VOCAB).vocab_size == MAX_VOCAB
    for n in (BUILTIN_SIZE[0] - 1, BUILTIN_SIZE[1] + 1, 10.0):
        with pytest.raises(ValueError, match=r"^n: .*built-in task"):
            builtin("sentiment", n=n)
