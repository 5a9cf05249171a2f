"""fast/execution: the optimized forward packs a batch only where a plain forward's results would not
change."""
import pytest
import torch

import lmforge
from lmforge.fast.paths import FastPaths


def _batch(empty_row: bool):
    ids = torch.randint(3, 99, (3, 12), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    if empty_row:
        mask[2] = 0
    return ids, mask


def _outputs(model, ids, mask, fast: bool) -> torch.Tensor:
    lmforge.optimize(model, enabled=fast)
    kwargs = {"decoder_input_ids": ids[:, :5]} if model.config.architecture == "encoder-decoder" else {}
    with torch.no_grad():
        return model(ids, mask, **kwargs).last_hidden_state


@pytest.mark.parametrize("name", ["t5-small", "bart-base", "bert-base"])
def test_a_row_of_padding_only_gives_the_plain_results(name):
    """A decoder cross-attends to every row of such a row's memory, and a pooled head reads it: the
    plain forward computes them, packing would have left them zeros."""
    torch.manual_seed(0)
    model = lmforge.build(lmforge.tiny(name)).eval()
    ids, mask = _batch(empty_row=True)
    plain = _outputs(model, ids, mask, fast=False)
    fast = _outputs(model, ids, mask, fast=True)
    torch.testing.assert_close(fast, plain, rtol=1e-5, atol=1e-5)
