"""bench.finetune_minilm's lmforge side runs as lmforge's own checks take its options (at toy size)."""


def test_the_lmforge_run_is_accepted_and_measured():
    """It gave keep_best=False to a run without validation, which finetune refuses as unread (51dedcf)."""
    from bench.finetune_minilm import lmforge_run
    from lmforge.tasks.formats import builtin

    _, splits = builtin("entailment", 40, 0)
    # one record of each label: the options are what is checked, and a step of the real MiniLM on 16 pairs
    # and their evaluation cost seconds
    train = list({r["label"]: r for r in splits["train"]}.values())
    result = lmforge_run({"train": train, "validation": splits["validation"][:2]}, 1, 0)
    assert len(train) == 2 and 0 <= result["accuracy"] <= 1 and result["examples_per_s"] > 0
