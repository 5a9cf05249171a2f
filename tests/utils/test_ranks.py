"""utils.ranks: one process or several under torchrun; the one rule of the jobs that run in one process,
which each Python entry point of such a job applies before any work (the command line: test_several_ranks)."""
import pytest

from lmforge.utils.ranks import one_process


def test_one_process_refuses_only_where_torchrun_started_several(monkeypatch):
    """The one rule of the jobs that run in one process: nothing alone or as the one process of a torchrun
    job, the caller's error class (one line naming the job) where WORLD_SIZE says there are several."""
    from lmforge.bakeoff import PlanError

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert one_process("quantize") is None
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert one_process("quantize") is None
    monkeypatch.setenv("WORLD_SIZE", "3")
    with pytest.raises(PlanError) as err:
        one_process("bakeoff", PlanError)
    assert str(err.value) == "bakeoff runs in one process: run it without torchrun (this process is one of " \
        "WORLD_SIZE=3)"


def test_one_process_names_world_size_as_the_field_to_change(monkeypatch):
    """An OptionsError (the default, and its subclasses) carries the field that names what to change, the
    environment's WORLD_SIZE, so that a caller reporting err.field points at it; other classes take none."""
    from lmforge import OptionsError
    from lmforge.bakeoff import PlanError
    from lmforge.config.checks import ConfigError

    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(OptionsError) as err:
        one_process("run_quantize")
    assert err.value.field == "WORLD_SIZE"
    with pytest.raises(ConfigError) as sub:
        one_process("run_quantize", ConfigError)
    assert sub.value.field == "WORLD_SIZE"
    with pytest.raises(PlanError) as plan:
        one_process("bakeoff", PlanError)
    assert str(plan.value).startswith("bakeoff runs in one process")


def _entry_points(out) -> dict:
    """name -> a call of each Python entry point of a job that runs in one process, writing `out`."""
    from lmforge.compress.prune_report import run_prune
    from lmforge.compress.quantize_report import run_quantize
    from lmforge.compress.sparse_finetune import SparseConfig, run_sparse_prune
    from lmforge.compress.task_distillation import run_distill
    from lmforge.data import shard_corpus
    from lmforge.pipelines.demo import run_demo
    from lmforge.retrieval.jobs import build_index_dir, run_ict, run_reader, run_realm, run_train
    from lmforge.retrieval.rag_job import run_rag
    from lmforge.train import TrainConfig

    cfg, sparse = TrainConfig(steps=1), SparseConfig(method="magnitude", sparsity=0.5)
    return {"run_distill": lambda: run_distill("teacher", [], None, [], out, train_cfg=cfg),
            "run_sparse_prune": lambda: run_sparse_prune("model", "cls", [], None, [], out, train_cfg=cfg,
                                                         sparse_cfg=sparse),
            "run_prune": lambda: run_prune("model", [], out, "ffn", 0.5),
            "run_quantize": lambda: run_quantize("model", out),
            "run_train": lambda: run_train("model", out, cfg),
            "run_reader": lambda: run_reader("model", out, cfg),
            "run_realm": lambda: run_realm("model", out, cfg),
            "run_ict": lambda: run_ict("model", out, cfg),
            "run_rag": lambda: run_rag("retriever", out, cfg),
            "build_index_dir": lambda: build_index_dir(out, "builtin"),
            "shard_corpus": lambda: shard_corpus(["a.txt"], "tokenizer", out),
            "run_demo": lambda: run_demo(out)}


@pytest.mark.parametrize("name", ["run_distill", "run_sparse_prune", "run_prune", "run_quantize", "run_train",
                                  "run_reader", "run_realm", "run_ict", "run_rag", "build_index_dir",
                                  "shard_corpus", "run_demo"])
def test_under_several_ranks_a_one_process_jobs_python_entry_refuses_before_any_work(name, tmp_path,
                                                                                      monkeypatch):
    """Every rank would run the whole job and write the same out: an OptionsError naming the entry point,
    before anything is read (the inputs named here do not exist) or written."""
    from lmforge import OptionsError

    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(OptionsError, match=f"^{name} runs in one process: run it without torchrun") as err:
        _entry_points(tmp_path / "out")[name]()
    assert err.value.field == "WORLD_SIZE"
    assert list(tmp_path.iterdir()) == []
