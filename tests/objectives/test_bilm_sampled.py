"""ELMo's sampled softmax (training, objectives/bilm.py) scores the logits of its full softmax (evaluation) at
the ids it samples: both read the LM head's features(), its transform included where the config has one
(lm_transform=True, as an ELMo made from BERT's or ALBERT's fields inherits). It read projection() on the raw
states, so such an ELMo trained one function and evaluated another, and ALBERT's d_embed failed on shapes."""
import math

import pytest
import torch
import torch.nn.functional as F

import lmforge
from lmforge.objectives.bilm import BiLM, draw_log_uniform, log_uniform
from lmforge.presets import ELMO_PRESETS

SMALL = dict(lstm_dim=64, char_embed_dim=8, char_filters=[[1, 8], [2, 8], [3, 16]])
TRANSFORMED = ["bert-base", "albert-base"]  # lm_transform=True; ALBERT's d_embed=16 against d_model=32


def built(preset: str, samples: int = 16) -> BiLM:
    """A tiny ELMo of `preset`'s fields under the sampled biLM, in training mode, its head's bias nonzero."""
    torch.manual_seed(0)
    model = lmforge.build(lmforge.tiny(preset, architecture="elmo", **SMALL))
    objective = BiLM(model, samples=samples).train()
    with torch.no_grad():
        objective.softmax.bias.normal_()  # zeros at init would hide a bias read at the wrong ids
    return objective


def expected_logits(objective: BiLM, hidden, target, negatives) -> torch.Tensor:
    """The full softmax's logits at [target, *negatives], less log(k Q(w)), an accidental hit -inf."""
    V = objective.model.config.vocab_size
    ids = torch.cat([target[:, None], negatives.expand(len(target), -1)], dim=1)
    corrected = objective.softmax(hidden).gather(1, ids) - math.log(len(negatives)) - log_uniform(ids, V)
    return corrected.masked_fill(F.pad(negatives[None] == target[:, None], (1, 0)), float("-inf"))


@pytest.mark.parametrize("preset", TRANSFORMED)
def test_the_sampled_logits_are_the_full_softmax_s_at_the_sampled_ids(preset):
    objective = built(preset)
    assert objective.model.config.lm_transform
    hidden, target = torch.randn(6, 32), torch.tensor([4, 7, 7, 50, 98, 0])
    negatives = torch.tensor([0, 3, 7, 20, 98])  # 7, 98 and 0: accidental hits of some rows
    with torch.no_grad():
        sampled = objective.sampled_logits(hidden, target, negatives)
        expected = expected_logits(objective, hidden, target, negatives)
    assert sampled.shape == (6, 6) and sampled[1, 3] == float("-inf") and sampled[1, 1] > float("-inf")
    torch.testing.assert_close(sampled, expected)


@pytest.mark.parametrize("preset", TRANSFORMED)
def test_the_training_loss_is_the_cross_entropy_of_the_full_softmax_s_logits_at_its_draw(preset):
    objective = built(preset)
    V = objective.model.config.vocab_size
    hidden, target = torch.randn(6, 32), torch.randint(0, V, (6,))
    torch.manual_seed(1)
    with torch.no_grad():
        loss = objective._loss(hidden, target)  # what forward() calls while training with samples
    torch.manual_seed(1)  # the same draw again
    negatives = draw_log_uniform(objective.samples, V)
    with torch.no_grad():
        logits = expected_logits(objective, hidden, target, negatives)
    expected = F.cross_entropy(logits, torch.zeros_like(target))
    torch.testing.assert_close(loss, expected)


def test_the_sampled_softmax_trains_the_head_s_transform():
    objective = built("bert-base")
    objective._loss(torch.randn(6, 32), torch.randint(0, 99, (6,))).backward()
    head = objective.softmax
    for part in (head.transform.weight, head.transform.bias, head.norm.weight):
        assert part.grad is not None and part.grad.abs().sum() > 0
    assert objective.uses_every_parameter()  # the transform no longer idles under sampling


def test_an_elmo_preset_s_training_loss_is_unchanged_bitwise():
    """ELMo's presets have no transform: the sampled softmax reads the states as it did (projection() on
    them), the same loss to the bit."""
    assert all(lmforge.get_config(name).lm_transform is False for name in ELMO_PRESETS)
    objective = built("elmo-small")
    hidden, target = torch.randn(6, 32), torch.randint(0, 99, (6,))
    torch.manual_seed(1)
    loss = objective._loss(hidden, target)
    torch.manual_seed(1)
    negatives, V, log_k = draw_log_uniform(16, 99), 99, math.log(16)
    weight, bias = objective.softmax.projection()  # the sampled softmax before features() was read
    true = (hidden * weight[target]).sum(-1) - log_k - log_uniform(target, V) + bias[target]
    noise = hidden @ weight[negatives].T - log_k - log_uniform(negatives, V) + bias[negatives]
    noise = noise.masked_fill(negatives[None] == target[:, None], float("-inf"))
    logits = torch.cat([true[:, None], noise], dim=1).float()
    assert torch.equal(loss, F.cross_entropy(logits, torch.zeros_like(target)))
