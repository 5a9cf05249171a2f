"""wrap() asks DDP to search for unused parameters only where a step can leave one without a gradient
(Objective.uses_every_parameter); tests/objectives/test_all_used.py checks the objectives' answers."""
import pytest
import torch
import torch.distributed as dist
from torch import nn

import lmforge
from lmforge.objectives import SpanMLM
from lmforge.objectives.electra_mlm import ElectraMLM
from lmforge.objectives.rtd import ReplacedTokenDetection
from lmforge.train import distributed

from tests.train.helpers import mlm_objective, toy_data

CPU = torch.device("cpu")


@pytest.fixture
def one_process_group(monkeypatch):
    """A gloo group of this process alone (a real DDP reducer), wrap() told it is one of two processes."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    monkeypatch.setattr(distributed, "world", lambda: (0, 2))
    yield
    dist.destroy_process_group()


def encoder():
    """A tiny BERT."""
    torch.manual_seed(0)
    return lmforge.build(lmforge.tiny("bert-base"))


def test_ddp_searches_for_unused_parameters_only_where_a_step_can_leave_one(one_process_group):
    # masked LM runs its head on every batch, on no rows where nothing is masked
    assert distributed.wrap(mlm_objective(), "ddp", CPU).find_unused_parameters is False
    # SpanBERT's LM head and SBO idle on a batch with no span; Replace MLM's head on one with nothing masked
    span = SpanMLM(encoder(), mask_id=3, special_ids=(1, 2))
    assert distributed.wrap(span, "ddp", CPU).find_unused_parameters is True
    replace = ElectraMLM(encoder(), mask_id=3, special_ids=(1, 2))
    assert distributed.wrap(replace, "ddp", CPU).find_unused_parameters is True
    # ELECTRA's generator and discriminator both have a loss on every batch
    rtd = ReplacedTokenDetection(encoder(), mask_id=3, special_ids=(1, 2))
    assert distributed.wrap(rtd, "ddp", CPU).find_unused_parameters is False
    # a module that says nothing (a fine-tuning task, DPR) keeps the search
    assert distributed.wrap(nn.Linear(4, 4), "ddp", CPU).find_unused_parameters is True


def test_masked_lm_trains_under_ddp_without_the_search_even_where_nothing_is_masked(one_process_group):
    objective = mlm_objective(dropout=0.0, attention_dropout=0.0)
    ddp = distributed.wrap(objective, "ddp", CPU)
    assert ddp.find_unused_parameters is False
    generator = torch.Generator()
    short = [{"input_ids": [1, 7, 2]}] * 4  # [CLS] w [SEP]: steps 1 and 2 draw no token to mask
    for step, examples in enumerate([toy_data(8)[:4], short, short, toy_data(8)[4:]]):
        batch = objective.collate([objective.corrupt(e, generator.manual_seed(step)) for e in examples])
        objective.zero_grad(set_to_none=True)
        ddp(batch).loss.backward()  # a parameter left without a gradient fails the next step's forward
        assert all(p.grad is not None for p in objective.parameters() if p.requires_grad), step
