"""run_prune, the Python face of `lmforge prune --method ffn|heads`: a method or sparsity it cannot take
is an OptionsError naming the field, before any model is read (a sparsity given as text was a TypeError)."""
from __future__ import annotations

import math

import pytest

from lmforge.compress.prune_report import run_prune
from lmforge.config.options import OptionsError


@pytest.mark.parametrize("method, sparsity, field", [
    ("ffx", 0.5, "method"), ("ffn", 0, "sparsity"), ("ffn", 1, "sparsity"), ("heads", -0.5, "sparsity"),
    ("ffn", math.nan, "sparsity"), ("ffn", "0.5", "sparsity"), ("ffn", True, "sparsity"),
    ("ffn", None, "sparsity"),
])
def test_a_bad_method_or_sparsity_is_refused_naming_it(tmp_path, method, sparsity, field):
    """Named as the option is in Python (the command line's flags are its own words)."""
    with pytest.raises(OptionsError, match=f"^{field} ") as err:
        run_prune(tmp_path / "no-model", [], tmp_path / "out", method, sparsity)
    assert err.value.field == field and "\n" not in str(err.value) and not (tmp_path / "out").exists()


def test_a_model_that_is_not_there_is_refused_naming_model_by_both_jobs(tmp_path):
    """run_quantize raised find_model_dir's plain ValueError where run_prune named the field."""
    from lmforge.compress.quantize_report import run_quantize

    with pytest.raises(OptionsError) as err:
        run_quantize(tmp_path / "no-model", tmp_path / "out")
    assert err.value.field == "model" and not (tmp_path / "out").exists()


def test_a_run_cut_short_after_saving_leaves_no_earlier_report_beside_the_new_model(tmp_path, monkeypatch):
    import lmforge.compress.prune_report as prune_report
    from lmforge.tasks.finetune import TaskConfig, make_task, save_model
    from tests.tasks.core import sentiment, tiny, tokenizer

    data = sentiment(40)["train"]
    model = tiny("bert-base", n_layers=2, n_heads=4)
    task = make_task("cls", model, tokenizer(), data, TaskConfig(max_len=32))
    save_model(task, tmp_path / "m")
    out = tmp_path / "out"
    out.mkdir()
    (out / "prune.json").write_text('{"an earlier run": true}\n')

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt  # Ctrl-C while both models are timed, after out/model is in place

    monkeypatch.setattr(prune_report, "measure_side_by_side", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_prune(tmp_path / "m", data[:8], out, "ffn", 0.5, kind="cls")
    assert (out / "model" / "config.json").is_file() and not (out / "prune.json").exists()


def test_every_compress_job_refuses_a_link_as_its_output_folder_before_any_work(tmp_path):
    from lmforge.compress.quantize_report import run_quantize
    from lmforge.compress.sparse_finetune import SparseConfig, run_sparse_prune
    from lmforge.compress.task_distillation import run_distill
    from lmforge.train import TrainConfig
    from tests.links import link_checkpoints, refuse_the_link
    from tests.tasks.core import tiny

    elsewhere, out, cfg = tmp_path / "elsewhere", tmp_path / "out", TrainConfig(steps=1)
    elsewhere.mkdir()
    out.symlink_to(elsewhere, target_is_directory=True)
    tiny("bert-base", n_layers=1).save(tmp_path / "m")
    training = [lambda: run_distill(tmp_path / "m", [], None, [], out, train_cfg=cfg),
                lambda: run_sparse_prune(tmp_path / "m", "cls", [], None, [], out, train_cfg=cfg,
                                         sparse_cfg=SparseConfig(method="magnitude", sparsity=0.5))]
    others = [lambda: run_prune(tmp_path / "m", [], out, "ffn", 0.5),
              lambda: run_quantize(tmp_path / "m", out)]
    refuse_the_link([*others, *training], out, elsewhere)
    # a training job's checkpoints/ too, before any work (magnitude pruning had written prune_settings.json)
    refuse_the_link(training, link_checkpoints(out, elsewhere), elsewhere)
    assert [p.name for p in out.iterdir()] == ["checkpoints"]


def test_an_out_that_holds_the_source_model_is_refused_by_both_jobs_before_any_work(tmp_path):
    """run_prune("p/model", out="p") replaced the model it was reading and measured the pruned one as
    "before" too (before == after); run_quantize wrote over its source alike. The command's --out refused
    it; Python now does too, with UnsafePath naming out (run_sparse_prune, which trains, too)."""
    from lmforge.compress.quantize_report import run_quantize
    from lmforge.compress.sparse_finetune import SparseConfig, run_sparse_prune
    from lmforge.train import TrainConfig
    from lmforge.utils.atomic import UnsafePath
    from tests.tasks.core import sentiment, tiny

    source = tmp_path / "p" / "model"
    tiny("bert-base", n_layers=1).save(source)
    before, train = sorted(p.name for p in source.iterdir()), sentiment(10)["train"]
    for out in (source, source.parent):
        sparse = lambda: run_sparse_prune(source, "cls", train, None, train, out,  # noqa: E731
                                          train_cfg=TrainConfig(steps=1),
                                          sparse_cfg=SparseConfig(method="magnitude", sparsity=0.5))
        for job in (lambda: run_prune(source, [], out, "ffn", 0.5), lambda: run_quantize(source, out),
                    sparse):
            with pytest.raises(UnsafePath, match=f"^out {out} (is|holds) the input model(_dir)? ") as err:
                job()
            assert err.value.field == "out"
    assert sorted(p.name for p in source.iterdir()) == before and sorted(source.parent.iterdir()) == [source]


@pytest.mark.parametrize("given, field", [(None, "records"), ("dev.jsonl", "records"), ([], "records"),
                                          ({"text": "a", "label": 0}, "records")])
def test_records_that_are_no_labelled_list_are_refused_by_every_compress_job_before_any_work(tmp_path, given,
                                                                                           field):
    """run_sparse_prune trained the whole run and wrote its model before a TypeError on records=None (a
    KeyError on a record without fields); run_prune and run_quantize (where None is no data) were
    TypeErrors or 'no examples'."""
    from lmforge.compress.quantize_report import run_quantize
    from lmforge.compress.sparse_finetune import SparseConfig, run_sparse_prune
    from lmforge.train import TrainConfig
    from tests.tasks.core import sentiment, tiny

    train = sentiment(40)["train"]
    tiny("bert-base", n_layers=1).save(tmp_path / "m")
    sparse = SparseConfig(method="magnitude", sparsity=0.5)
    quantize = [lambda: run_quantize(tmp_path / "m", tmp_path / "out", given, "cls")]
    jobs = [lambda: run_prune(tmp_path / "m", given, tmp_path / "out", "ffn", 0.5, "cls"),
            *(quantize if given is not None else []),  # None: no data to score
            lambda: run_sparse_prune(tmp_path / "m", "cls", train, None, given, tmp_path / "out",
                                     train_cfg=TrainConfig(steps=1), sparse_cfg=sparse)]
    for job in jobs:
        with pytest.raises(OptionsError, match=f"^{field} ") as err:
            job()
        assert err.value.field == field and not (tmp_path / "out").exists()


def test_a_record_without_its_fields_and_empty_importance_records_are_refused_naming_them(tmp_path):
    """A record without the task's fields was a KeyError; importance_records=[] ranked on records, unsaid."""
    from tests.tasks.core import sentiment, tiny

    data = sentiment(40)["train"][:8]
    tiny("bert-base", n_layers=1).save(tmp_path / "m")
    with pytest.raises(OptionsError, match="^records:2: no fields") as err:
        run_prune(tmp_path / "m", [data[0], {"sentence": "x"}], tmp_path / "out", "ffn", 0.5, "cls")
    assert err.value.field == "records"
    with pytest.raises(OptionsError, match="^importance_records is empty") as err:
        run_prune(tmp_path / "m", data, tmp_path / "out", "ffn", 0.5, "cls", [])
    assert err.value.field == "importance_records" and not (tmp_path / "out").exists()


def test_records_for_a_model_that_is_not_fine_tuned_are_refused_not_ignored(tmp_path):
    """run_quantize with records on a model without task.json and no kind dropped them: no metric, unsaid."""
    from lmforge.compress.quantize_report import run_quantize
    from tests.tasks.core import sentiment, tiny

    tiny("bert-base", n_layers=1).save(tmp_path / "m")
    with pytest.raises(OptionsError, match="no task.json") as err:
        run_quantize(tmp_path / "m", tmp_path / "out", sentiment(40)["train"][:8])
    assert err.value.field == "kind" and not (tmp_path / "out").exists()


@pytest.mark.parametrize("preset", ["t5-small", "albert-base"])
def test_heads_that_cannot_be_cut_are_refused_before_their_importance_is_estimated(tmp_path, monkeypatch,
                                                                                   preset):
    """T5's per-head position biases were refused only after the whole iterative importance curve ran."""
    import lmforge.compress.prune_report as prune_report
    from tests.tasks.core import saved_classifier, sentiment

    data = sentiment(40)["train"][:8]
    saved_classifier(tmp_path / "m", preset, "t5" if preset == "t5-small" else "bert", data, 16)
    monkeypatch.setattr(prune_report, "pruning_curve",
                        lambda *a, **k: pytest.fail("importance was estimated"))
    with pytest.raises(OptionsError, match="^method=heads: pruned_heads needs separate layers") as err:
        run_prune(tmp_path / "m", data, tmp_path / "out", "heads", 0.5)  # said --method, a flag Python lacks
    assert err.value.field == "method"
    assert not (tmp_path / "out" / "model").exists()


def test_a_sparsity_that_removes_nothing_and_an_int8_folder_name_the_fields_not_the_flags(tmp_path):
    """run_prune said "--sparsity 0.001 removes no FFN unit" and "--model DIR: the model is int8-quantised",
    flags the Python caller never gave (plain ValueErrors): OptionsErrors naming sparsity and model_dir."""
    import lmforge
    from lmforge.compress.quantize import quantize
    from tests.tasks.core import saved_classifier, sentiment

    data = sentiment(40)["train"][:8]
    saved_classifier(tmp_path / "m", "bert-base", "bert", data, 16)
    with pytest.raises(OptionsError) as nothing:
        run_prune(tmp_path / "m", data, tmp_path / "out", "ffn", 0.001)
    assert str(nothing.value).startswith("sparsity=0.001 removes no FFN unit")
    assert nothing.value.field == "sparsity" and "--" not in str(nothing.value)
    lmforge.save(quantize(lmforge.load(tmp_path / "m"), alpha=None), tmp_path / "int8")
    with pytest.raises(OptionsError) as int8:
        run_prune(tmp_path / "int8", data, tmp_path / "out8", "ffn", 0.5, kind="cls")
    assert str(int8.value).startswith(f"model_dir {tmp_path / 'int8'}: the model is int8-quantised")
    assert int8.value.field == "model_dir" and not (tmp_path / "out8").exists()


def test_the_command_line_names_its_flags_for_the_same_refusals(tmp_path, capsys):
    """lmforge prune keeps --model and --sparsity, where Python names model_dir and sparsity."""
    import json

    import lmforge
    from lmforge.cli import main
    from lmforge.compress.quantize import quantize
    from tests.tasks.core import saved_classifier, sentiment

    data = sentiment(40)["train"][:8]
    saved_classifier(tmp_path / "m", "bert-base", "bert", data, 16)
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in data))
    lmforge.save(quantize(lmforge.load(tmp_path / "m"), alpha=None), tmp_path / "int8")
    cases = (("m", "0.001", "--sparsity 0.001 removes no FFN unit"),
             ("int8", "0.5", f"--model {tmp_path / 'int8'}: the model is int8-quantised"))
    for model, sparsity, said in cases:
        argv = ["--model", str(tmp_path / model), "--task", "cls", "--method", "ffn", "--sparsity", sparsity]
        assert main(["prune", *argv, "--data", str(tmp_path / "d.jsonl"), "--out", str(tmp_path / "o")]) == 2
        assert capsys.readouterr().err.startswith(f"lmforge prune: error: {said}")


def test_a_bad_record_is_named_as_the_caller_gave_it_python_s_by_number_a_file_s_by_line(tmp_path, capsys):
    """From Python run_prune and run_quantize named a record without its fields `data:1` (field "data"),
    an argument neither has: now records:n, field records; --data names its file and line, as before."""
    import json

    from lmforge.cli import main
    from lmforge.compress.quantize_report import run_quantize
    from tests.tasks.core import saved_classifier, sentiment

    data = sentiment(40)["train"][:8]
    saved_classifier(tmp_path / "m", "bert-base", "bert", data, 16)
    bad = [data[0], data[1], {"sentence": "x"}]  # the built-in records say their own line (0, 1)
    jobs = {"prune": lambda: run_prune(tmp_path / "m", bad, tmp_path / "out", "ffn", 0.5),
            "quantize": lambda: run_quantize(tmp_path / "m", tmp_path / "out", bad)}
    for job in jobs.values():
        with pytest.raises(OptionsError, match="^records:3: no fields 'text', 'label'") as err:
            job()
        assert err.value.field == "records" and not (tmp_path / "out").exists()
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in bad))
    flags = {"prune": ["--method", "ffn", "--sparsity", "0.5"], "quantize": []}
    for command, more in flags.items():
        argv = [command, "--model", str(tmp_path / "m"), *more, "--data", str(tmp_path / "d.jsonl")]
        assert main([*argv, "--out", str(tmp_path / "out")]) == 2
        said = capsys.readouterr().err
        assert said.startswith(f"lmforge {command}: error: {tmp_path / 'd.jsonl'}:3: no columns 'text'")
        assert not (tmp_path / "out").exists()
