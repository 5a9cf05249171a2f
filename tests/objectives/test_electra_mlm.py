"""ELECTRA's MLM ablations: the copy mixture's likelihood by hand, no [MASK] shown to the model,
the rows each variant predicts, gradients to both networks and the copy gate."""
from __future__ import annotations

import math

import pytest
import torch

import lmforge
from lmforge.objectives import IGNORE
from lmforge.objectives.electra_mlm import ElectraMLM, copy_log_likelihood

MASK, CLS, SEP = 3, 1, 2


def test_the_copy_mixture_by_hand():
    logits = torch.zeros(2, 3)  # softmax 1/3 each
    gate = torch.zeros(2)  # D = 1/2
    got = copy_log_likelihood(logits, gate, inputs=torch.tensor([1, 0]), target=torch.tensor([1, 2]))
    assert torch.allclose(got, torch.tensor([math.log(0.5 + 0.5 / 3), math.log(0.5 / 3)]))


def _batch(objective, n=4, T=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    rows = []
    for i in range(n):
        ids = [CLS] + torch.randint(5, 60, (T - 2,), generator=g).tolist() + [SEP]
        rows.append(objective.corrupt({"input_ids": ids, "segment_ids": [0] * T},
                                      torch.Generator().manual_seed(i)))
    return objective.collate(rows)


def _objective(all_tokens, preset="electra-base"):
    torch.manual_seed(0)
    return ElectraMLM(lmforge.build(lmforge.tiny(preset)), MASK, all_tokens=all_tokens, ratio=0.5,
                      special_ids=(CLS, SEP))


def test_the_model_never_sees_mask_and_predicts_its_rows():
    for all_tokens in (False, True):
        objective = _objective(all_tokens)
        batch = _batch(objective)
        assert (batch["input_ids"] == MASK).any()  # the generator's input is masked
        seen = []
        hook = objective.model.register_forward_pre_hook(lambda m, args: seen.append(args[0].clone()))
        loss = objective(batch)
        hook.remove()
        assert not (seen[0] == MASK).any() and torch.isfinite(loss.loss)
        loss.loss.backward()
        assert all(p.grad is not None for p in objective.lm.parameters())
        gen_grads = [p.grad for n, p in objective.generator.model.named_parameters() if "tokens" not in n]
        assert all(g is not None and g.abs().sum() > 0 for g in gen_grads)
        assert (objective.copy is not None) == all_tokens
        if all_tokens:
            assert objective.copy.weight.grad.abs().sum() > 0


def test_replace_mlm_predicts_only_selected_positions():
    objective = _objective(False)
    batch = _batch(objective)
    batch["labels"][:] = IGNORE  # nothing selected: no loss from the model, and no NaN
    loss = objective(batch)
    assert loss.metrics["mlm_loss"] == 0 and torch.isfinite(loss.loss)


@pytest.mark.parametrize("all_tokens", [False, True])
def test_an_xlnet_model_trains_through_a_generator_head_that_reaches_the_shared_table(all_tokens):
    """XLNet's LM head has no transform: the 16-wide generator's read its hidden states straight into the
    32-wide tied table, a shape error at the first step, until it got ELECTRA's d_model -> E transform."""
    objective = _objective(all_tokens, "xlnet-base")
    head = objective.generator.lm
    assert head.tied is objective.model.tokens and head.transform.in_features == 16
    loss = objective(_batch(objective))
    loss.loss.backward()
    assert torch.isfinite(loss.loss) and loss.metrics["mlm_loss"] > 0
    assert head.transform.weight.grad.abs().sum() > 0 and objective.model.tokens.weight.grad.abs().sum() > 0
