"""bench.finetune_minilm's lmforge side runs as lmforge's own checks take its options (at toy size)."""


def test_the_lmforge_run_is_accepted_and_measured():
    """It gave keep_best=False to a run without validation, which finetune refuses as unread (51dedcf)."""
    from bench.finetune_minilm import lmforge_run
    from lmforge.tasks.formats import builtin

    _, splits = builtin("entailment", 40, 0)
    result = lmforge_run({"train": splits["train"][:16], "validation": splits["validation"]}, 1, 0)
    assert 0 <= result["accuracy"] <= 1 and result["examples_per_s"] > 0
