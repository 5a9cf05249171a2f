"""What a torchrun job of several processes must be to train as one run, checked in one process by its
environment (WORLD_SIZE, LOCAL_RANK) and a CUDA faked on the CPU: parallel ddp or fsdp, and each process of a
node on its own GPU."""
import pytest
import torch
from torch import nn

from lmforge.config.options import OptionsError
from lmforge.tasks.finetune import finetune
from lmforge.train import TrainConfig
from lmforge.train import distributed
from lmforge.train.config import check_ranks
from lmforge.train.loop import resolve_device  # the name the Trainer resolves its device by
from lmforge.train.pretrain import pretrain


@pytest.fixture
def gpus(monkeypatch):
    """A machine of two CUDA devices, as torch.cuda answers; the devices made current, in order."""
    current = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", current.append)
    return current


JOBS = {"pretrain": lambda out, cfg: pretrain("mlm", out, cfg, preset="bert-tiny", data=[str(out) + ".txt"]),
        "finetune": lambda out, cfg: finetune("no-such-model", None, "cls", [{"text": "a", "label": "x"}],
                                              None, out, cfg)}


@pytest.mark.parametrize("job", sorted(JOBS))
def test_parallel_none_under_several_ranks_is_refused_before_any_work(job, tmp_path, monkeypatch):
    """No all-reduce: each rank would train a copy of its own on its share of the batches, and rank 0's
    alone be written. An OptionsError naming parallel, before the missing input is looked at."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(OptionsError) as err:
        JOBS[job](tmp_path / "out", TrainConfig(steps=1))
    assert err.value.field == "parallel" and "\n" not in str(err.value)
    assert str(err.value).startswith("parallel=none under torchrun (WORLD_SIZE=2): each process would train")
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setenv("WORLD_SIZE", "1")  # one process: parallel=none is the run
    assert check_ranks(TrainConfig(steps=1)).parallel == "none"


def test_a_trainer_built_directly_under_several_ranks_refuses_parallel_none(monkeypatch):
    """wrap, where the Trainer would have gone on with the model unwrapped: refused too."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setattr(distributed, "world", lambda: (0, 2))
    with pytest.raises(OptionsError) as err:
        distributed.wrap(nn.Linear(2, 2), "none", torch.device("cpu"))
    assert err.value.field == "parallel"


def test_each_process_of_a_node_trains_on_the_gpu_of_its_local_rank(gpus, monkeypatch):
    """device=auto (or cuda) under torchrun: cuda:LOCAL_RANK, made current; all on cuda:0 before."""
    monkeypatch.setenv("WORLD_SIZE", "4")  # two nodes of two
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert resolve_device("auto") == torch.device("cuda", 1)
    assert gpus == [torch.device("cuda", 1)]
    assert resolve_device("cuda") == torch.device("cuda", 1)
    assert resolve_device("cuda:0") == torch.device("cuda", 0)  # a GPU named is taken as given
    assert resolve_device("cpu") == torch.device("cpu")
    gpus.clear()
    monkeypatch.delenv("WORLD_SIZE")  # one process: as it was
    assert resolve_device("auto") == torch.device("cuda") and gpus == []


def test_a_local_rank_past_the_nodes_gpus_is_refused_naming_device(gpus, monkeypatch):
    """Three processes on a node of two GPUs: the third would share one; refused, with the options (before any
    read) as by the Trainer's device."""
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("LOCAL_RANK", "2")
    for refused in (lambda: resolve_device("auto"), lambda: check_ranks(TrainConfig(parallel="ddp"))):
        with pytest.raises(OptionsError) as err:
            refused()
        assert err.value.field == "device" and "\n" not in str(err.value)
        assert "LOCAL_RANK=2 but the machine has 2 CUDA device(s)" in str(err.value)
    assert gpus == []
    assert check_ranks(TrainConfig(parallel="ddp", device="cpu")).device == "cpu"  # no GPU asked for
