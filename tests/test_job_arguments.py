"""The public jobs' options objects: one given as a dict of its fields (or as another options class) is an
OptionsError naming the argument, "task_cfg must be a TaskConfig, got dict", said before any work
(utils.errors.instance_of); it was a TypeError or an AttributeError from deep in the run."""
import pytest

from lmforge.config.options import OptionsError
from lmforge.train import TrainConfig


def _distill(train_cfg, cfg=None):
    from lmforge.compress.task_distillation import distill

    return lambda out: distill(out / "teacher", [], None, out / "run", train_cfg=train_cfg, cfg=cfg)


def _prune(train_cfg, sparse_cfg, task_cfg=None):
    from lmforge.compress.sparse_finetune import prune_finetune

    return lambda out: prune_finetune("bert-tiny", "cls", [], None, out / "run", train_cfg=train_cfg,
                                      sparse_cfg=sparse_cfg, task_cfg=task_cfg)


def _pretrain(train, recipe=None, inputs=None):
    from lmforge.train.pretrain import pretrain

    return lambda out: pretrain("mlm", out / "run", train, recipe, inputs)


def _retrieval(job: str):
    from lmforge.retrieval import jobs, rag_job

    run = getattr(jobs, job, None) or getattr(rag_job, job)
    return lambda out: run(str(out / "model"), out / "run", {"steps": 1})


def _sparse():
    from lmforge.compress.sparse_finetune import SparseConfig

    return SparseConfig(method="magnitude", sparsity=0.5)


@pytest.mark.parametrize("job, name, cls", [
    (lambda: _distill({"steps": 1}), "train_cfg", "TrainConfig"),
    (lambda: _distill(TrainConfig(), {"temperature": 2.0}), "cfg", "DistillConfig"),
    (lambda: _prune({"steps": 1}, _sparse()), "train_cfg", "TrainConfig"),
    (lambda: _prune(TrainConfig(), {"method": "magnitude"}), "sparse_cfg", "SparseConfig"),
    (lambda: _prune(TrainConfig(), _sparse(), {"max_len": 32}), "task_cfg", "TaskConfig"),
    (lambda: _pretrain({"steps": 1}), "train", "TrainConfig"),
    (lambda: _pretrain(TrainConfig(), {"max_len": 32}), "recipe", "RecipeOptions"),
    (lambda: _pretrain(TrainConfig(), None, {"preset": "bert-tiny"}), "inputs", "PretrainInputs"),
    *[(lambda job=job: _retrieval(job), "cfg", "TrainConfig")
      for job in ("run_train", "run_reader", "run_realm", "run_ict", "run_rag")],
], ids=["distill-train_cfg", "distill-cfg", "prune-train_cfg", "prune-sparse_cfg", "prune-task_cfg",
        "pretrain-train", "pretrain-recipe", "pretrain-inputs", "run_train", "run_reader", "run_realm",
        "run_ict", "run_rag"])
def test_a_dict_for_a_jobs_options_object_is_refused_naming_the_argument(tmp_path, job, name, cls):
    with pytest.raises(OptionsError) as err:
        job()(tmp_path)
    assert str(err.value) == f"{name} must be a {cls}, got dict" and err.value.field == name
    assert not (tmp_path / "run").exists()


def test_instance_of_takes_its_class_and_none_where_optional():
    from lmforge.utils.errors import instance_of

    cfg = TrainConfig()
    assert instance_of(cfg, TrainConfig, "cfg") is cfg and instance_of(None, TrainConfig, "cfg") is None
    with pytest.raises(OptionsError) as err:
        instance_of(None, TrainConfig, "train_cfg", optional=False)
    assert str(err.value) == "train_cfg must be a TrainConfig, got NoneType"
    assert err.value.field == "train_cfg"
