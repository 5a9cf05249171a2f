"""bench.finetune_minilm's lmforge side runs as lmforge's own checks take its options (at toy size)."""


def test_the_lmforge_run_is_accepted_and_measured(tmp_path, monkeypatch):
    """It gave keep_best=False to a run without validation, which finetune refuses as unread (51dedcf)."""
    import bench.finetune_minilm as bench
    from lmforge.tasks.formats import builtin
    from tests.tasks.core import tiny, tokenizer

    # a tiny BERT with its tokenizer in the real MiniLM's place: the bench's options are what is checked,
    # and loading, stepping, saving and evaluating the real checkpoint took seconds
    tiny("bert-base", n_layers=1, n_heads=2).save(tmp_path / "tiny")
    tokenizer().save(tmp_path / "tiny")
    named, finetune = [], bench.finetune

    def on_the_tiny_model(name, *args, **kw):
        named.append(name)
        return finetune(tmp_path / "tiny", *args, **kw)

    monkeypatch.setattr(bench, "finetune", on_the_tiny_model)
    _, splits = builtin("entailment", 40, 0)
    result = bench.lmforge_run({"train": splits["train"][:16], "validation": splits["validation"]}, 1, 0)
    assert named == ["all-MiniLM-L6-v2"] and 0 <= result["accuracy"] <= 1 and result["examples_per_s"] > 0
